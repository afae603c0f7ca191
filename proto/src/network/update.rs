//! Which changes of a Network running pods can follow. The driver applies `mtu` and the
//! subnets' `routes` to running pods in place; everything that decides *which* device, VLAN or
//! address a pod has cannot move under a running pod, so an update that changes it is refused
//! before it is stored (the webhook) rather than leaving running pods and new pods on two
//! different networks under one name. Pure, so the webhook and the reconciler share the texts.

use crate::netconfig::FieldError;
use crate::network::{Network, NetworkSpec};

/// The advice every "cannot be moved live" refusal ends with.
const MOVE: &str = "cannot be moved live; create another Network and move the workloads";

/// Every change from `old` to `new` that running pods cannot follow, each naming its field and
/// why (empty: the update may be stored). `old.status.addresses` says whether a subnet may be
/// removed: without it (a Network the controller has not counted yet) removal is allowed, as
/// nothing can have been allocated from it through knic's own accounting.
pub fn validate_update(old: &Network, new: &Network) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let (o, n) = (&old.spec, &new.spec);
    if o.vlan != n.vlan {
        let stay = match o.vlan {
            Some(id) => format!("stay on VLAN {id}"),
            None => "stay untagged".to_owned(),
        };
        errors.push(FieldError::new(
            "spec.vlan",
            format!(
                "cannot change from {} to {}: running pods {stay} and {MOVE}",
                shown(o.vlan),
                shown(n.vlan)
            ),
        ));
    }
    if o.devices != n.devices {
        let (was, is) = (o.devices.summary(), n.devices.summary());
        let change = if was == is {
            // Two selector lists of one length summarise alike; the change is still real.
            format!("cannot change its selection ({was})")
        } else {
            format!("cannot change from {was} to {is}")
        };
        errors.push(FieldError::new(
            "spec.devices",
            format!("{change}: running pods keep the devices they have and {MOVE}"),
        ));
    }
    if o.interface_name != n.interface_name {
        let ifname = |v: &Option<String>| v.clone().unwrap_or_else(|| "the default name".into());
        let (was, is) = (ifname(&o.interface_name), ifname(&n.interface_name));
        errors.push(FieldError::new(
            "spec.interfaceName",
            format!("cannot change from {was} to {is}: running pods keep {was} and {MOVE}"),
        ));
    }
    if o.vxlan != n.vxlan {
        // Running pods sit on the bridge and VXLAN device of the old VNI; freeing it would let
        // another Network take it and join them.
        let show = |v: &Option<crate::network::Vxlan>| match v {
            Some(x) => format!("VNI {} port {}", x.vni, x.port()),
            None => "no overlay".to_owned(),
        };
        let field = match (&o.vxlan, &n.vxlan) {
            (Some(a), Some(b)) if a.vni == b.vni => "spec.vxlan.port",
            (Some(_), Some(_)) => "spec.vxlan.vni",
            _ => "spec.vxlan",
        };
        if show(&o.vxlan) != show(&n.vxlan) {
            errors.push(FieldError::new(
                field,
                format!(
                    "cannot change from {} to {}: running pods stay on their segment and {MOVE}",
                    show(&o.vxlan),
                    show(&n.vxlan)
                ),
            ));
        }
    }
    ipam(old, n, &mut errors);
    errors
}

/// The subnets: an entry keeps its cidr and gateway while pods may hold its addresses; entries
/// may be appended, and removed while the Network has no address in use.
fn ipam(old: &Network, n: &NetworkSpec, errors: &mut Vec<FieldError>) {
    let o = &old.spec;
    if o.ipam.subnets.is_empty() != n.ipam.subnets.is_empty() {
        errors.push(FieldError::new(
            "spec.ipam",
            "cannot switch between subnets and static",
        ));
        return;
    }
    let in_use = old
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| (a.total.saturating_sub(a.free), a.total));
    for (i, was) in o.ipam.subnets.iter().enumerate() {
        match n.ipam.subnets.iter().position(|s| s.cidr == was.cidr) {
            Some(j) => {
                let is = &n.ipam.subnets[j];
                if is.gateway != was.gateway {
                    errors.push(FieldError::new(
                        format!("spec.ipam.subnets[{j}].gateway"),
                        format!(
                            "cannot change from {} to {}: the new gateway may be allocated to a \
                             pod, and running pods route through the old one; add the subnet \
                             with the new gateway to another Network",
                            name(&was.gateway),
                            name(&is.gateway)
                        ),
                    ));
                }
            }
            // The entry at the same place names another cidr that was not there before: the
            // subnet was edited, not removed.
            None if n
                .ipam
                .subnets
                .get(i)
                .is_some_and(|s| o.ipam.subnets.iter().all(|p| p.cidr != s.cidr)) =>
            {
                errors.push(FieldError::new(
                    format!("spec.ipam.subnets[{i}].cidr"),
                    format!(
                        "cannot change {} to {}: pods hold addresses of it; add the new subnet \
                         as another entry",
                        was.cidr, n.ipam.subnets[i].cidr
                    ),
                ));
            }
            None => {
                if let Some((used, total)) = in_use.filter(|(used, _)| *used > 0) {
                    errors.push(FieldError::new(
                        "spec.ipam.subnets",
                        format!(
                            "cannot remove {} while the Network has addresses in use ({used} of \
                             {total})",
                            was.cidr
                        ),
                    ));
                }
            }
        }
    }
}

fn shown(v: Option<u16>) -> String {
    v.map_or_else(|| "none".to_owned(), |v| v.to_string())
}

fn name(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| "none".to_owned())
}

#[cfg(test)]
#[path = "update_tests.rs"]
mod tests;
