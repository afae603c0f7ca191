//! The bandwidth of a shared port, kept at prepare. With consumable capacity the scheduler
//! subtracts each claim's share from the port's `bandwidth` capacity; in child-slot mode (the
//! apiserver without `DRAConsumableCapacity`) it counts slots only, so knic does the
//! arithmetic: a claim that names no rate gets the port's default share (what the scheduler
//! would have taken), and a claim whose rate would take the port's children past its total is
//! refused, naming the claims that hold the rest. The check runs in both modes, under the
//! checkpoint lock, against what the checkpoint records: it costs nothing where the scheduler
//! already kept the budget and catches a port whose policy changed under running pods.

use std::collections::BTreeMap;

use knic_proto::netconfig::Bandwidth;

use crate::claims::checkpoint::{Checkpoint, PreparedClaim, PreparedDevice};
use crate::sharing::BandwidthPolicy;

/// Fills in the default share and checks every shared port of `prepared` against its total.
/// `policy_of` answers a device's port policy as published (`None`: not shared, or its
/// bandwidth is unknown, which leaves it unlimited and unaccounted). The error names the
/// request, the port and the claims holding it.
pub fn keep(
    prepared: &mut PreparedClaim,
    checkpoint: &Checkpoint,
    policy_of: impl Fn(&PreparedDevice) -> Option<BandwidthPolicy>,
) -> Result<(), String> {
    let policies: BTreeMap<String, BandwidthPolicy> = prepared
        .devices
        .iter()
        .filter_map(|d| Some((d.device.clone(), policy_of(d)?)))
        .collect();
    // This claim's own rates per port, for a claim with two children on one port.
    let mut mine: BTreeMap<String, u64> = BTreeMap::new();
    for a in &mut prepared.attachments {
        let Some(policy) = policies.get(&a.plan.device) else {
            continue;
        };
        let bandwidth = a.plan.bandwidth.get_or_insert(Bandwidth {
            egress: policy.default,
            burst: None,
        });
        let port = a.plan.host_ifname.clone();
        let held: Vec<(&PreparedClaim, u64)> = checkpoint
            .claims
            .values()
            .filter(|c| c.uid != prepared.uid)
            .filter_map(|c| {
                let rate = c
                    .attachments
                    .iter()
                    .filter(|o| o.plan.host_ifname == port && o.plan.mode.new_child().is_some())
                    .filter_map(|o| o.plan.bandwidth.as_ref().map(|b| b.egress))
                    .fold(0u64, u64::saturating_add);
                (rate > 0).then_some((c, rate))
            })
            .collect();
        // Saturating: a rate near u64::MAX (no upper bound in the config) must be refused, not
        // wrap into something that fits.
        let others = held.iter().map(|(_, r)| *r).fold(0u64, u64::saturating_add);
        let ours = mine.entry(port.clone()).or_default();
        *ours = ours.saturating_add(bandwidth.egress);
        if others.saturating_add(*ours) > policy.total {
            // By name, not by the checkpoint's UID order: real UIDs are random, and an operator
            // (and a test) reads the same list for the same claims every time.
            let mut held = held;
            held.sort_by(|(a, _), (b, _)| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
            let holders: Vec<String> = held
                .iter()
                .map(|(c, r)| format!("{}/{} {}", c.namespace, c.name, rate(*r)))
                .collect();
            return Err(format!(
                "request {}: bandwidth.egress: {} on shared port {port} would exceed its total of \
                 {}: {} is prepared for other claims ({})",
                a.plan.request,
                rate(bandwidth.egress),
                rate(policy.total),
                rate(others),
                if holders.is_empty() {
                    "none".to_owned()
                } else {
                    holders.join(", ")
                }
            ));
        }
    }
    Ok(())
}

fn rate(bits: u64) -> String {
    format!("{}bit/s", knic_proto::quantity::canonical(bits))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::checkpoint::Attachment;
    use crate::netns::AttachMode;
    use crate::netns::fake::plan;

    const PORT: &str = "ens1f0";

    fn policy() -> BandwidthPolicy {
        BandwidthPolicy {
            total: 10_000_000_000,
            default: 1_000_000_000,
            min: 1_000_000,
            step: None,
        }
    }

    fn claim(name: &str, slot: &str, egress: Option<u64>) -> PreparedClaim {
        let mut p = plan(slot, PORT, "net1", &[]);
        p.mode = AttachMode::Child {
            child: knic_proto::netconfig::ChildKind::Macvlan("bridge".into()),
            uplink: None,
        };
        p.bandwidth = egress.map(|egress| Bandwidth {
            egress,
            burst: None,
        });
        PreparedClaim {
            network_label: None,
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            pod_uid: format!("pod-{name}"),
            pod_name: name.into(),
            devices: vec![PreparedDevice {
                request: "nic".into(),
                pool: "node-a".into(),
                device: slot.into(),
                share_id: None,
                consumed: Default::default(),
                published: None,
            }],
            configs: vec![],
            prepared_at: 0,
            attachments: vec![Attachment::planned(p)],
            allocations: vec![],
            functions: vec![],
        }
    }

    fn node(held: &[(&str, &str, u64)]) -> Checkpoint {
        let mut cp = Checkpoint::default();
        for (name, slot, egress) in held {
            let c = claim(name, slot, Some(*egress));
            cp.claims.insert(c.uid.clone(), c);
        }
        cp
    }

    #[test]
    fn a_claim_without_a_rate_gets_the_default_share() {
        let mut c = claim("a", "ens1f0-s0", None);
        keep(&mut c, &Checkpoint::default(), |_| Some(policy())).expect("fits");
        assert_eq!(
            c.attachments[0].plan.bandwidth,
            Some(Bandwidth {
                egress: 1_000_000_000,
                burst: None
            })
        );
        // Not shared (or bandwidth unknown): no limit is invented.
        let mut d = claim("d", "eth9", None);
        keep(&mut d, &Checkpoint::default(), |_| None).expect("not shared");
        assert_eq!(d.attachments[0].plan.bandwidth, None);
    }

    #[test]
    fn the_ports_total_is_kept_and_the_holders_are_named() {
        let held = node(&[
            ("a", "ens1f0-s0", 6_000_000_000),
            ("b", "ens1f0-s1", 3_000_000_000),
        ]);
        let mut fits = claim("c", "ens1f0-s2", Some(1_000_000_000));
        keep(&mut fits, &held, |_| Some(policy())).expect("exactly full");
        let mut over = claim("c", "ens1f0-s2", Some(2_000_000_000));
        assert_eq!(
            keep(&mut over, &held, |_| Some(policy())).expect_err("over"),
            "request nic: bandwidth.egress: 2Gbit/s on shared port ens1f0 would exceed its \
             total of 10Gbit/s: 9Gbit/s is prepared for other claims (ns/a 6Gbit/s, ns/b \
             3Gbit/s)"
        );
        // Listed by name whatever the UIDs' order (a real cluster's are random: b's sorted
        // first once in CI, and the real twin's expected text did not match).
        let mut by_uid = held.clone();
        for (uid, c) in std::mem::take(&mut by_uid.claims) {
            let mut c = c;
            c.uid = if c.name == "a" { "z-uid".into() } else { uid };
            by_uid.claims.insert(c.uid.clone(), c);
        }
        let mut over = claim("c", "ens1f0-s2", Some(2_000_000_000));
        assert!(
            keep(&mut over, &by_uid, |_| Some(policy()))
                .expect_err("over")
                .ends_with("(ns/a 6Gbit/s, ns/b 3Gbit/s)")
        );
        let huge = node(&[("a", "ens1f0-s0", u64::MAX), ("b", "ens1f0-s1", u64::MAX)]);
        let mut small = claim("c", "ens1f0-s2", Some(1));
        assert!(
            keep(&mut small, &huge, |_| Some(policy())).is_err(),
            "sums saturate instead of wrapping"
        );
        let mut alone = claim("c", "ens1f0-s2", Some(20_000_000_000));
        assert_eq!(
            keep(&mut alone, &Checkpoint::default(), |_| Some(policy())).expect_err("over"),
            "request nic: bandwidth.egress: 20Gbit/s on shared port ens1f0 would exceed its \
             total of 10Gbit/s: 0bit/s is prepared for other claims (none)"
        );
    }

    #[test]
    fn a_repeated_prepare_does_not_count_itself_and_other_ports_do_not_count() {
        let mut held = node(&[("c", "ens1f0-s2", 9_000_000_000)]);
        let other = {
            let mut o = claim("x", "ens2f0-s0", Some(9_000_000_000));
            o.attachments[0].plan.host_ifname = "ens2f0".into();
            o
        };
        held.claims.insert(other.uid.clone(), other);
        let mut again = claim("c", "ens1f0-s2", Some(9_000_000_000));
        keep(&mut again, &held, |_| Some(policy())).expect("itself and another port");
    }
}
