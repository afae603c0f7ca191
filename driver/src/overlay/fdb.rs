//! The forwarding entries a node's VXLAN segments must hold.
//!
//! Rules: per VNI this node has a segment of, one flood entry (all-zero MAC) per *other* node
//! with at least one live pod on the VNI, so broadcast and ARP reach exactly the nodes that need
//! them (head-end replication, no multicast); one entry per remote pod's MAC. This node's own
//! pods are reached through the bridge, and held addresses (a stable identity between pods)
//! have no pod. A MAC announced from two nodes (a pod moved, or a forged announcement) goes to
//! the oldest announcement, with a warning, so a newcomer cannot steal a running pod's traffic.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use knic_proto::network::Network;

use crate::netns::overlay::FdbEntry;

/// One overlay pod interface as the cluster announces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The announcing object (for warnings), e.g. a NetworkAddress name.
    pub name: String,
    /// The Network it is an interface of.
    pub network: String,
    /// VXLAN network identifier of its Network.
    pub vni: u32,
    /// Its MAC.
    pub mac: [u8; 6],
    /// Its node's tunnel endpoint.
    pub vtep: IpAddr,
    /// When it was announced (creation time, seconds); older wins a MAC conflict.
    pub since: i64,
    /// Kept for a returning identity, with no pod behind it now.
    pub held: bool,
}

/// What every local segment must hold, and why some announcements were ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Entries per VNI, for the VNIs this node has segments of (an empty set: no remote pods).
    pub entries: BTreeMap<u32, BTreeSet<FdbEntry>>,
    /// One line per ignored conflicting announcement.
    pub warnings: Vec<String>,
}

/// The entries for `local_vnis` on the node whose tunnel endpoint is `local_vtep`.
pub fn desired(endpoints: &[Endpoint], local_vtep: IpAddr, local_vnis: &BTreeSet<u32>) -> Desired {
    let mut out = Desired {
        entries: local_vnis.iter().map(|v| (*v, BTreeSet::new())).collect(),
        warnings: Vec::new(),
    };
    let mut live: Vec<&Endpoint> = endpoints
        .iter()
        .filter(|e| !e.held && local_vnis.contains(&e.vni))
        .collect();
    live.sort_by(|a, b| (a.since, &a.name).cmp(&(b.since, &b.name)));
    // (VNI, MAC) → the winning endpoint, oldest first; a local winner still claims the MAC.
    let mut owner: BTreeMap<(u32, [u8; 6]), &Endpoint> = BTreeMap::new();
    for e in live {
        match owner.get(&(e.vni, e.mac)) {
            Some(first) if first.vtep != e.vtep => out.warnings.push(format!(
                "{} announces MAC {} on VNI {} from {}, which {} announced first from {}: ignored",
                e.name,
                mac_text(e.mac),
                e.vni,
                e.vtep,
                first.name,
                first.vtep
            )),
            Some(_) => {}
            None => {
                owner.insert((e.vni, e.mac), e);
            }
        }
    }
    for ((vni, mac), e) in owner {
        if e.vtep == local_vtep {
            continue;
        }
        let set = out.entries.entry(vni).or_default();
        set.insert(FdbEntry {
            mac: [0; 6],
            dst: e.vtep,
        });
        set.insert(FdbEntry { mac, dst: e.vtep });
    }
    out
}

/// The endpoints whose VNI is their Network's: an announcement is written by its node, which
/// the admission policy checks, but its VNI is not; one naming another Network's VNI (a
/// compromised or confused node) would join that Network's segment, so it is dropped here, with
/// a warning. Networks without `spec.vxlan` (or unknown to this node) admit nothing.
pub fn admitted(endpoints: &[Endpoint], networks: &[Network]) -> (Vec<Endpoint>, Vec<String>) {
    let vni: BTreeMap<&str, u32> = networks
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, n.spec.vxlan.as_ref()?.vni)))
        .collect();
    let mut warnings = Vec::new();
    let kept = endpoints
        .iter()
        .filter(|e| {
            let ok = vni.get(e.network.as_str()) == Some(&e.vni);
            if !ok {
                warnings.push(format!(
                    "{} announces VNI {} for Network {:?}, whose VNI is {}: ignored",
                    e.name,
                    e.vni,
                    e.network,
                    vni.get(e.network.as_str())
                        .map_or("unknown".to_string(), |v| v.to_string())
                ));
            }
            ok
        })
        .cloned()
        .collect();
    (kept, warnings)
}

/// What to remove from and add to `current` to reach `want`; removals first, so a MAC that
/// moved node is never briefly pointed at both.
pub fn diff(current: &[FdbEntry], want: &BTreeSet<FdbEntry>) -> (Vec<FdbEntry>, Vec<FdbEntry>) {
    let have: BTreeSet<FdbEntry> = current.iter().copied().collect();
    let remove = have.difference(want).copied().collect();
    let add = want.difference(&have).copied().collect();
    (remove, add)
}

fn mac_text(m: [u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(name: &str, vni: u32, last: u8, vtep: &str, since: i64) -> Endpoint {
        Endpoint {
            name: name.into(),
            network: "ovl".into(),
            vni,
            mac: [2, 0, 0, 0, 0, last],
            vtep: vtep.parse().unwrap(),
            since,
            held: false,
        }
    }

    fn entry(last: u8, dst: &str) -> FdbEntry {
        FdbEntry {
            mac: [2, 0, 0, 0, 0, last],
            dst: dst.parse().unwrap(),
        }
    }

    fn flood(dst: &str) -> FdbEntry {
        FdbEntry {
            mac: [0; 6],
            dst: dst.parse().unwrap(),
        }
    }

    const A: &str = "10.99.0.1";
    const B: &str = "10.99.0.2";
    const C: &str = "10.99.0.3";

    #[test]
    fn remote_pods_of_local_vnis_only_with_one_flood_entry_per_node() {
        let endpoints = vec![
            ep("a1", 10, 1, A, 1), // this node's: reached through the bridge
            ep("b1", 10, 2, B, 2),
            ep("b2", 10, 3, B, 3),
            ep("c1", 10, 4, C, 4),
            ep("c2", 20, 5, C, 5), // a VNI this node has no segment of
        ];
        let d = desired(&endpoints, A.parse().unwrap(), &BTreeSet::from([10, 30]));
        assert_eq!(
            d.entries[&10],
            BTreeSet::from([flood(B), flood(C), entry(2, B), entry(3, B), entry(4, C)])
        );
        // A local segment with no remote pods holds nothing (its old entries get removed).
        assert!(d.entries[&30].is_empty());
        assert!(!d.entries.contains_key(&20));
        assert!(d.warnings.is_empty());
    }

    #[test]
    fn held_addresses_and_dual_stack_twins() {
        let mut held = ep("b1-held", 10, 2, B, 1);
        held.held = true;
        // A dual-stack pod announces its MAC twice (an IPv4 and an IPv6 object): one entry.
        let endpoints = vec![held, ep("c1-v4", 10, 4, C, 2), ep("c1-v6", 10, 4, C, 2)];
        let d = desired(&endpoints, A.parse().unwrap(), &BTreeSet::from([10]));
        assert_eq!(d.entries[&10], BTreeSet::from([flood(C), entry(4, C)]));
        assert!(d.warnings.is_empty());
    }

    #[test]
    fn a_mac_announced_from_two_nodes_goes_to_the_oldest_with_a_warning() {
        let endpoints = vec![ep("late", 10, 7, C, 9), ep("first", 10, 7, B, 3)];
        let d = desired(&endpoints, A.parse().unwrap(), &BTreeSet::from([10]));
        assert_eq!(d.entries[&10], BTreeSet::from([flood(B), entry(7, B)]));
        assert_eq!(
            d.warnings,
            vec![
                "late announces MAC 02:00:00:00:00:07 on VNI 10 from 10.99.0.3, which first \
                 announced first from 10.99.0.2: ignored"
                    .to_string()
            ]
        );
        // A local pod that announced first keeps its MAC: no entry sends it elsewhere.
        let endpoints = vec![ep("mine", 10, 7, A, 1), ep("forged", 10, 7, C, 2)];
        let d = desired(&endpoints, A.parse().unwrap(), &BTreeSet::from([10]));
        assert!(d.entries[&10].is_empty(), "{:?}", d.entries);
        assert_eq!(d.warnings.len(), 1);
    }

    #[test]
    fn the_difference_removes_first_and_moves_a_mac() {
        let current = vec![flood(B), entry(2, B), entry(9, C)];
        let want = BTreeSet::from([flood(B), flood(C), entry(2, C)]);
        let (remove, add) = diff(&current, &want);
        assert_eq!(remove, vec![entry(2, B), entry(9, C)]);
        assert_eq!(add, vec![flood(C), entry(2, C)]);
        let (remove, add) = diff(&want.iter().copied().collect::<Vec<_>>(), &want);
        assert!(
            remove.is_empty() && add.is_empty(),
            "at rest nothing is written"
        );
    }

    #[test]
    fn an_announcement_on_another_networks_vni_is_dropped() {
        let network = |name: &str, vni: Option<u32>| -> Network {
            let mut spec = serde_json::json!({"ipam": {"subnets": [{"cidr": "10.42.0.0/24"}]},
                                              "namespaces": {"names": ["ns"]}});
            if let Some(v) = vni {
                spec["vxlan"] = serde_json::json!({"vni": v});
            } else {
                spec["devices"] = serde_json::json!({"kind": "vf"});
            }
            serde_json::from_value(serde_json::json!({
                "apiVersion": "knic.dev/v1alpha1", "kind": "Network",
                "metadata": {"name": name}, "spec": spec}))
            .expect("network")
        };
        let networks = [
            network("ovl", Some(10)),
            network("red", Some(20)),
            network("blue", None),
        ];
        let mut forged = ep("forged", 20, 7, B, 1); // says Network ovl, VNI 20 (red's)
        forged.network = "ovl".into();
        let mut stray = ep("stray", 10, 8, B, 1);
        stray.network = "blue".into();
        let good = ep("good", 10, 9, C, 1);
        let (kept, warnings) = admitted(&[forged, stray, good.clone()], &networks);
        assert_eq!(kept, vec![good]);
        assert_eq!(
            warnings,
            vec![
                "forged announces VNI 20 for Network \"ovl\", whose VNI is 10: ignored",
                "stray announces VNI 10 for Network \"blue\", whose VNI is unknown: ignored",
            ]
        );
    }
}
