//! Networks that share a VLAN on purpose (`spec.vlanShareGroup`).
//!
//! Two Networks with the same VLAN on devices both may use put their pods on one layer-2
//! segment. That is refused unless both name the same group, because an id picked twice by
//! accident would silently join two tenants' broadcast domains. Once both opt in, what must
//! still hold is what any single segment needs:
//! * one MTU: a frame larger than a receiver's MTU is dropped without an error, so a mismatch
//!   breaks large packets (UDP, ICMP, TCP before MSS clamps) between the two Networks' pods;
//!   and the driver's pods of one VLAN hang off one host VLAN child per parent, which cannot
//!   carry more than its own MTU;
//! * no address handed out twice: each Network records its allocations under names of its own,
//!   so two allocators over one subnet would both give out `192.0.2.10`. Subnets are therefore
//!   disjoint, or identical with disjoint allocatable addresses (the subnet split by `exclude`,
//!   each side's gateway excluded by the other), which is how two teams share one subnet and
//!   router. Overlapping subnets with different prefixes are refused even when the addresses
//!   could be kept apart: hosts on one link would disagree about what is on-link and which
//!   address is the broadcast.

use crate::netconfig::{Cidr, FieldError, is_dns_label};

use super::NetworkSpec;

/// `spec.vlanShareGroup` on its own: a DNS label, and only with a VLAN (untagged Networks on
/// the same devices are one segment already and are kept apart by their subnets alone).
pub(super) fn check_field(spec: &NetworkSpec, errors: &mut Vec<FieldError>) {
    let Some(group) = &spec.vlan_share_group else {
        return;
    };
    if !is_dns_label(group) {
        errors.push(FieldError::new(
            "spec.vlanShareGroup",
            format!(
                "{group:?} is not a DNS label (1-63 lowercase letters, digits or '-', starting and ending with a letter or digit)"
            ),
        ));
    }
    if spec.vlan.is_none() {
        errors.push(FieldError::new(
            "spec.vlanShareGroup",
            "only applies when spec.vlan is set: it lets Networks share a VLAN id, and untagged Networks need no group to use the same devices",
        ));
    }
}

/// The group two Networks with VLAN `vlan` on overlapping devices share, or `None` after
/// pushing why they may not: both must name the same group.
pub(super) fn group<'a>(
    vlan: u16,
    spec: &'a NetworkSpec,
    other_name: &str,
    other: &NetworkSpec,
    errors: &mut Vec<FieldError>,
) -> Option<&'a str> {
    let mine = spec.vlan_share_group.as_deref();
    let theirs = other.vlan_share_group.as_deref();
    let (path, message) = match (mine, theirs) {
        (Some(mine), Some(theirs)) if mine == theirs => return Some(mine),
        (None, None) => (
            "spec.vlan",
            format!(
                "VLAN {vlan} is already used by network {other_name:?} on overlapping devices; to share it on purpose, both Networks must set the same spec.vlanShareGroup"
            ),
        ),
        (None, Some(theirs)) => (
            "spec.vlan",
            format!(
                "VLAN {vlan} is already used by network {other_name:?} on overlapping devices, shared with group {theirs:?}; set spec.vlanShareGroup to {theirs:?} to join it"
            ),
        ),
        (Some(mine), None) => (
            "spec.vlanShareGroup",
            format!(
                "network {other_name:?} uses VLAN {vlan} on overlapping devices without a vlanShareGroup; a VLAN is shared only when every Network on it sets the same group (add vlanShareGroup: {mine} to {other_name:?})"
            ),
        ),
        (Some(mine), Some(theirs)) => (
            "spec.vlanShareGroup",
            format!(
                "{mine:?} differs from group {theirs:?} of network {other_name:?}, which uses VLAN {vlan} on overlapping devices; Networks share a VLAN only with the same group"
            ),
        ),
    };
    errors.push(FieldError::new(path, message));
    None
}

/// What two Networks in group `group` on VLAN `vlan` must still agree on: one MTU, and no
/// address either may hand out that the other may hand out too or uses as its gateway.
/// `my_subnets` are this Network's valid subnets with their index.
pub(super) fn check_shared(
    vlan: u16,
    group: &str,
    (spec, my_subnets): (&NetworkSpec, &[(usize, Cidr)]),
    (other_name, other, their_subnets): (&str, &NetworkSpec, &[(usize, Cidr)]),
    errors: &mut Vec<FieldError>,
) {
    let shares = format!("which shares VLAN {vlan} (group {group:?}) on overlapping devices");
    if spec.mtu != other.mtu {
        errors.push(FieldError::new(
            "spec.mtu",
            format!(
                "{} differs from {} of network {other_name:?}, {shares}; Networks on one segment need one MTU (larger frames are dropped by the smaller side)",
                mtu(spec.mtu),
                mtu(other.mtu)
            ),
        ));
    }
    for &(i, subnet) in my_subnets {
        for &(j, theirs) in their_subnets {
            if subnet == theirs {
                split_subnet(i, subnet, (spec, other_name, other, j), &shares, errors);
            } else if super::validate::overlaps(subnet, theirs) {
                errors.push(FieldError::new(
                    format!("spec.ipam.subnets[{i}].cidr"),
                    format!(
                        "{subnet} overlaps {theirs} of network {other_name:?}, {shares}; Networks on one segment may split one subnet (the same CIDR) but not overlap with different prefixes, which disagree about on-link and broadcast addresses"
                    ),
                ));
            }
        }
    }
}

/// One subnet used by both Networks: their pools must be disjoint and neither's gateway
/// allocatable by the other.
fn split_subnet(
    i: usize,
    cidr: Cidr,
    (spec, other_name, other, j): (&NetworkSpec, &str, &NetworkSpec, usize),
    shares: &str,
    errors: &mut Vec<FieldError>,
) {
    // A subnet that builds no pool is reported by its own Network's validation.
    let (Some(Ok(mine)), Some(Ok(theirs))) = (
        spec.ipam.subnets.get(i).map(super::Subnet::pool),
        other.ipam.subnets.get(j).map(super::Subnet::pool),
    ) else {
        return;
    };
    let path = format!("spec.ipam.subnets[{i}]");
    if let Some(gateway) = mine.gateway().filter(|g| theirs.contains_usable(*g)) {
        errors.push(FieldError::new(
            format!("{path}.gateway"),
            format!(
                "{gateway} can be allocated to a pod by network {other_name:?}, {shares} with subnet {cidr}; that network must list it in exclude"
            ),
        ));
    }
    if let Some(gateway) = theirs.gateway().filter(|g| mine.contains_usable(*g)) {
        errors.push(FieldError::new(
            format!("{path}.exclude"),
            format!(
                "{gateway} is the gateway of network {other_name:?}, {shares} with subnet {cidr}, and can be allocated to a pod here; list it in exclude"
            ),
        ));
    }
    if let Some((first, count)) = mine.common(&theirs) {
        errors.push(FieldError::new(
            format!("{path}.exclude"),
            format!(
                "{} of {cidr} (from {first}) can be allocated by both this network and network {other_name:?}, {shares}; exclude the other network's range so no address goes to two pods",
                addresses(count)
            ),
        ));
    }
}

fn mtu(mtu: Option<u32>) -> String {
    mtu.map_or_else(|| "unset (the device's own)".to_owned(), |m| m.to_string())
}

fn addresses(count: u128) -> String {
    if count == 1 {
        "1 address".to_owned()
    } else {
        format!("{count} addresses")
    }
}
