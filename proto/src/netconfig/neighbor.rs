//! Static neighbors (`neighbors: [{address, hardwareAddress}]`): permanent ARP (IPv4) and NDP
//! (IPv6) entries on the pod's interface, for peers that do not answer ARP/ND (some
//! appliances, a gateway behind a filtering switch) or to pin a router's MAC.
//!
//! Rules, each with its reason:
//! * `address` is a unicast IP a next hop could be ([`super::check_next_hop`]: not
//!   unspecified, multicast, broadcast, loopback, class E or IPv4-mapped): the kernel resolves
//!   neighbors only for unicast next hops, so any other entry would never be used;
//! * it is not one of the interface's own static addresses (the kernel answers for those);
//! * with static addresses, it lies inside the subnet of one of them (so it is reachable
//!   on-link, the only place a neighbor entry is ever consulted) and is not a reserved address
//!   of that subnet (network, broadcast, subnet-router anycast). IPv6 link-local addresses are
//!   on-link on every IPv6 link and exempt. With `ipam` (addresses unknown at admission) and
//!   without addresses (an interface addressed by the workload itself) the subnet rule is not
//!   applied: the entry is then only checked by class;
//! * `hardwareAddress` is a unicast, non-zero MAC (a multicast MAC as a neighbor's would send
//!   unicast traffic to a group);
//! * each address is listed once (the kernel keeps one entry per address; a second would
//!   silently replace the first), and at most [`MAX_NEIGHBORS`] are listed.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::addr::{check_next_hop, check_not_reserved};
use super::cidr::parse_ip;
use super::validate::check_mac;
use super::{Cidr, FieldError};

/// More entries than any pod's link has peers; bounds the attach's work and the checkpoint.
pub const MAX_NEIGHBORS: usize = 256;

/// One static neighbor as written by the operator.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NeighborConfig {
    /// The neighbor's IPv4 or IPv6 address.
    pub address: String,
    /// Its MAC, `aa:bb:cc:dd:ee:ff`.
    pub hardware_address: String,
}

/// One checked static neighbor: a permanent entry (`NUD_PERMANENT`) on the pod's interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Neighbor {
    /// IPv4 (an ARP entry) or IPv6 (an NDP entry).
    pub address: IpAddr,
    /// Stored as `aa:bb:cc:dd:ee:ff` so the checkpoint stays readable.
    #[serde(with = "mac_text")]
    pub hardware_address: [u8; 6],
}

/// Checks `neighbors` against the interface's static addresses (`None`: unknown, because some
/// address was invalid or addressing is by IPAM), reporting problems into `errors`.
pub(super) fn validate_neighbors(
    neighbors: &[NeighborConfig],
    static_addresses: Option<&[Cidr]>,
    errors: &mut Vec<FieldError>,
) -> Vec<Neighbor> {
    if neighbors.len() > MAX_NEIGHBORS {
        errors.push(FieldError::new(
            "neighbors",
            format!(
                "{} entries; at most {MAX_NEIGHBORS} are allowed",
                neighbors.len()
            ),
        ));
        return Vec::new();
    }
    let mut out = Vec::with_capacity(neighbors.len());
    let mut first_index: BTreeMap<IpAddr, usize> = BTreeMap::new();
    for (i, neighbor) in neighbors.iter().enumerate() {
        let path = format!("neighbors[{i}]");
        let address = check_address(&neighbor.address, static_addresses)
            .map_err(|message| errors.push(FieldError::new(format!("{path}.address"), message)))
            .ok();
        let mac = check_mac(&neighbor.hardware_address)
            .map_err(|e| {
                errors.push(FieldError::new(
                    format!("{path}.hardwareAddress"),
                    e.to_string(),
                ));
            })
            .ok();
        let Some(address) = address else { continue };
        if let Some(j) = first_index.get(&address) {
            errors.push(FieldError::new(
                format!("{path}.address"),
                format!("{address} is already listed at neighbors[{j}]"),
            ));
            continue;
        }
        first_index.insert(address, i);
        if let Some(hardware_address) = mac {
            out.push(Neighbor {
                address,
                hardware_address,
            });
        }
    }
    out
}

fn check_address(text: &str, static_addresses: Option<&[Cidr]>) -> Result<IpAddr, String> {
    let ip = parse_ip(text).map_err(|e| e.to_string())?;
    check_next_hop(ip).map_err(|e| e.to_string())?;
    let Some(addresses) = static_addresses.filter(|a| !a.is_empty()) else {
        return Ok(ip);
    };
    if addresses.iter().any(|a| a.addr == ip) {
        return Err(format!("{ip} is one of this interface's own addresses"));
    }
    let link_local = matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local());
    if !link_local && !addresses.iter().any(|a| a.contains(ip)) {
        return Err(format!(
            "{ip} is not inside any address's subnet, so it is not on-link and its entry would never be used"
        ));
    }
    if let Some(e) = addresses
        .iter()
        .filter(|a| a.contains(ip))
        .find_map(|a| check_not_reserved(a.network(), ip).err())
    {
        return Err(e.to_string());
    }
    Ok(ip)
}

/// Serde adapter storing a required MAC as its readable `aa:bb:cc:dd:ee:ff` string.
mod mac_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        mac: &[u8; 6],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&super::super::validate::format_mac(mac))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<[u8; 6], D::Error> {
        let text = String::deserialize(deserializer)?;
        super::super::validate::parse_mac(&text).map_err(serde::de::Error::custom)
    }
}
