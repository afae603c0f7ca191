//! The issue-27 link settings a device's plan carries (static neighbors), from the merged
//! config of its request.

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use knic_proto::netconfig::Neighbor;
    use serde_json::json;

    use super::super::tests::{claim, config, device};
    use super::super::{IpamAddresses, configure, plans};

    #[test]
    fn neighbors_go_into_the_plan_class_then_claim_as_a_whole_list() {
        let c = claim(
            vec![
                device("a", "d0", Some("eth1")),
                device("b", "d1", Some("eth2")),
            ],
            vec![
                config(
                    "FromClass",
                    &[],
                    json!({"neighbors": [
                        {"address": "192.0.2.1", "hardwareAddress": "02:00:00:00:00:01"},
                        {"address": "192.0.2.2", "hardwareAddress": "02:00:00:00:00:02"}
                    ]}),
                ),
                config(
                    "FromClaim",
                    &["b"],
                    json!({"neighbors": [
                        {"address": "fe80::1", "hardwareAddress": "02:00:00:00:00:03"}
                    ]}),
                ),
            ],
        );
        let p = plans(&c, &configure(&c), &BTreeSet::new(), &IpamAddresses::new()).unwrap();
        let addresses = |i: usize| -> Vec<String> {
            p[i].link
                .neighbors
                .iter()
                .map(|n: &Neighbor| n.address.to_string())
                .collect()
        };
        assert_eq!(addresses(0), ["192.0.2.1", "192.0.2.2"]);
        assert_eq!(addresses(1), ["fe80::1"]);
        assert_eq!(p[1].link.neighbors[0].hardware_address, [2, 0, 0, 0, 0, 3]);
    }

    /// With IPAM the on-link rule runs once the addresses are known: the merged config is
    /// validated again with them (as routes' gateways are).
    #[test]
    fn neighbors_of_an_ipam_interface_are_checked_against_the_given_addresses() {
        use crate::claims::ipam::{Addressing, Allocation};
        let c = claim(
            vec![device("a", "d0", Some("eth1"))],
            vec![config(
                "FromClaim",
                &[],
                json!({"ipam": {"network": "blue"}, "neighbors": [
                    {"address": "192.0.2.1", "hardwareAddress": "02:00:00:00:00:01"},
                    {"address": "10.0.0.1", "hardwareAddress": "02:00:00:00:00:02"}
                ]}),
            )],
        );
        let ipam = IpamAddresses::from([(
            0,
            Addressing {
                allocations: vec![Allocation {
                    network: "blue".into(),
                    name: "blue-a".into(),
                    uid: "uid".into(),
                    address: "192.0.2.10/24".parse().unwrap(),
                    identity: None,
                }],
                routes: Vec::new(),
                overlay: None,
            },
        )]);
        let err = plans(&c, &configure(&c), &BTreeSet::new(), &ipam)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "request a: network \"blue\" gave 192.0.2.10/24: neighbors[1].address: 10.0.0.1 is \
             not inside any address's subnet, so it is not on-link and its entry would never be \
             used"
        );
    }

    #[test]
    fn a_bad_neighbor_fails_the_plan_with_its_path() {
        let c = claim(
            vec![device("a", "d0", Some("eth1"))],
            vec![config(
                "FromClaim",
                &[],
                json!({"neighbors": [{"address": "224.0.0.5", "hardwareAddress": "02:00:00:00:00:01"}]}),
            )],
        );
        let err = plans(&c, &configure(&c), &BTreeSet::new(), &IpamAddresses::new())
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "request a: neighbors[0].address: 224.0.0.5 is not a unicast address"
        );
    }
}
