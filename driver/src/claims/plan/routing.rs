//! Policy routing across the devices of one pod, checked at prepare: each device's config was
//! validated alone, but a VRF is a device of the pod's namespace that several claims may name.
//! Two of them naming one VRF with different tables, or a VRF named like an interface of the
//! pod, would only fail at attach (while the pod starts); here they fail prepare with the
//! claim's error.

use std::collections::BTreeMap;

use knic_proto::netconfig::FieldError;

use crate::netns::AttachPlan;

/// The problems of `plans` (this claim's) beside `others` (the plans of the pod's other
/// claims already prepared), each naming the request.
pub fn pod_clashes(plans: &[AttachPlan], others: &[&AttachPlan]) -> Vec<FieldError> {
    let mut errors = Vec::new();
    // VRF name → (table, who).
    let mut vrfs: BTreeMap<&str, (u32, String)> = BTreeMap::new();
    for other in others {
        if let Some(vrf) = &other.routing.vrf {
            vrfs.entry(&vrf.name)
                .or_insert((vrf.table, format!("another claim's {}", other.pod_ifname)));
        }
    }
    let interfaces: Vec<&str> = others
        .iter()
        .map(|p| p.pod_ifname.as_str())
        .chain(plans.iter().map(|p| p.pod_ifname.as_str()))
        .collect();
    // (family, table) of a default route outside main → the interface whose it is: a second
    // one in the same table would be "already there" and never installed, so its traffic
    // would leave through the first (every sourceBasedRouting defaults to table 100).
    let defaults = |p: &AttachPlan| -> Vec<(bool, u32)> {
        p.routes
            .iter()
            .filter(|r| r.destination.prefix_len == 0)
            .filter_map(|r| {
                r.table
                    .filter(|t| *t != 254)
                    .map(|t| (r.destination.addr.is_ipv4(), t))
            })
            .collect()
    };
    let mut tables: BTreeMap<(bool, u32), String> = BTreeMap::new();
    for other in others {
        for key in defaults(other) {
            tables
                .entry(key)
                .or_insert_with(|| format!("another claim's {}", other.pod_ifname));
        }
    }
    for plan in plans {
        for key in defaults(plan) {
            match tables.get(&key) {
                Some(who) => errors.push(FieldError::new(
                    format!("request {}: routes", plan.request),
                    format!(
                        "the {} default route in table {} is also {who}'s in this pod; give each \
                         interface its own table (sourceBasedRouting.table, routes[].table)",
                        if key.0 { "IPv4" } else { "IPv6" },
                        key.1
                    ),
                )),
                None => {
                    tables.insert(
                        key,
                        format!("request {} ({})", plan.request, plan.pod_ifname),
                    );
                }
            }
        }
    }
    for plan in plans {
        let Some(vrf) = &plan.routing.vrf else {
            continue;
        };
        let path = format!("request {}: vrf", plan.request);
        if interfaces.contains(&vrf.name.as_str()) {
            errors.push(FieldError::new(
                format!("{path}.name"),
                format!(
                    "{} is the name of an interface of this pod; the VRF device needs another",
                    vrf.name
                ),
            ));
            continue;
        }
        match vrfs.get(vrf.name.as_str()) {
            Some((table, who)) if *table != vrf.table => errors.push(FieldError::new(
                format!("{path}.table"),
                format!(
                    "VRF {} is already used with table {table} by {who} in this pod; one VRF has \
                     one table",
                    vrf.name
                ),
            )),
            Some(_) => {}
            None => {
                vrfs.insert(&vrf.name, (vrf.table, format!("request {}", plan.request)));
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::json;

    use super::super::tests::{claim, config, device};
    use super::super::{IpamAddresses, configure, plans};
    use super::*;
    use crate::claims::ipam::{Addressing, Allocation};

    #[test]
    fn source_routing_is_expanded_from_ipam_addresses() {
        let c = claim(
            vec![device("a", "d0", Some("eth1"))],
            vec![config(
                "FromClaim",
                &[],
                json!({"ipam": {"network": "blue"}, "sourceBasedRouting": {"table": 120},
                       "interface": {"name": "data0"},
                       "rules": [{"iif": "data0", "table": 120, "priority": 50}]}),
            )],
        );
        let ipam = IpamAddresses::from([(
            0,
            Addressing {
                allocations: vec![Allocation {
                    network: "blue".into(),
                    name: "blue-a".into(),
                    uid: "uid".into(),
                    address: "192.0.2.10/24".parse().expect("cidr"),
                    identity: None,
                }],
                routes: serde_json::from_value(
                    json!([{"destination": "0.0.0.0/0", "gateway": "192.0.2.1"}]),
                )
                .expect("routes"),
                overlay: None,
            },
        )]);
        let p = plans(&c, &configure(&c), &BTreeSet::new(), &ipam).expect("plans");
        let routes: Vec<String> = p[0]
            .routes
            .iter()
            .map(|r| format!("{} table {:?}", r.destination, r.table))
            .collect();
        assert_eq!(
            routes,
            ["0.0.0.0/0 table Some(120)", "192.0.2.0/24 table Some(120)"]
        );
        let rules: Vec<String> = p[0]
            .routing
            .rules
            .iter()
            .map(crate::netns::routing::describe)
            .collect();
        assert_eq!(
            rules,
            [
                "-4 rule priority 10000 from 192.0.2.10/32 lookup 120",
                "-4 rule priority 50 iif data0 lookup 120",
                "-6 rule priority 50 iif data0 lookup 120",
            ]
        );
    }

    fn vrf_plans(first: (&str, u32), second: (&str, u32)) -> Vec<AttachPlan> {
        let c = claim(
            vec![
                device("a", "d0", Some("eth1")),
                device("b", "d1", Some("eth2")),
            ],
            vec![
                config(
                    "FromClaim",
                    &["a"],
                    json!({"vrf": {"name": first.0, "table": first.1}}),
                ),
                config(
                    "FromClaim",
                    &["b"],
                    json!({"vrf": {"name": second.0, "table": second.1}}),
                ),
            ],
        );
        plans(&c, &configure(&c), &BTreeSet::new(), &IpamAddresses::new()).expect("plans")
    }

    #[test]
    fn one_vrf_name_with_two_tables_in_a_pod_is_refused() {
        let p = vrf_plans(("blue", 10), ("blue", 11));
        assert_eq!(
            pod_clashes(&p, &[])
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            [
                "request b: vrf.table: VRF blue is already used with table 10 by request a in this \
              pod; one VRF has one table"
            ]
        );
        // Across claims: the other claim's plan is already prepared.
        let theirs = vrf_plans(("red", 20), ("green", 21));
        let mine = vrf_plans(("red", 22), ("green", 21));
        assert_eq!(
            pod_clashes(&mine, &theirs.iter().collect::<Vec<_>>())
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            [
                "request a: vrf.table: VRF red is already used with table 20 by another claim's \
              net1 in this pod; one VRF has one table"
            ]
        );
        assert!(pod_clashes(&vrf_plans(("blue", 10), ("blue", 10)), &[]).is_empty());
    }

    #[test]
    fn two_interfaces_with_their_default_route_in_one_table_are_refused() {
        // Request a on table 100; request b on `table_b` (`None`: sbr's default, 100 too).
        let sbr = |table_b: Option<u32>| {
            let b_sbr = table_b.map_or_else(|| json!({}), |t| json!({"table": t}));
            let c = claim(
                vec![
                    device("a", "d0", Some("eth1")),
                    device("b", "d1", Some("eth2")),
                ],
                vec![
                    config(
                        "FromClaim",
                        &["a"],
                        json!({"addresses": ["192.0.2.10/24"], "sourceBasedRouting": {"table": 100},
                               "routes": [{"destination": "0.0.0.0/0", "gateway": "192.0.2.1"}]}),
                    ),
                    config(
                        "FromClaim",
                        &["b"],
                        json!({"addresses": ["198.51.100.10/24"], "sourceBasedRouting": b_sbr,
                               "routes": [{"destination": "0.0.0.0/0", "gateway": "198.51.100.1"}]}),
                    ),
                ],
            );
            plans(&c, &configure(&c), &BTreeSet::new(), &IpamAddresses::new()).expect("plans")
        };
        // Both on the default table 100.
        assert_eq!(
            pod_clashes(&sbr(None), &[])
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            [
                "request b: routes: the IPv4 default route in table 100 is also request a (net1)'s \
                 in this pod; give each interface its own table (sourceBasedRouting.table, \
                 routes[].table)"
            ]
        );
        assert!(pod_clashes(&sbr(Some(101)), &[]).is_empty());
    }

    #[test]
    fn a_vrf_named_like_an_interface_of_the_pod_is_refused() {
        let p = vrf_plans(("net2", 10), ("blue", 11));
        assert_eq!(
            pod_clashes(&p, &[])
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            [
                "request a: vrf.name: net2 is the name of an interface of this pod; the VRF device \
              needs another"
            ]
        );
    }
}
