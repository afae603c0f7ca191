//! Policy routing in the pod: the VRF the interface is enslaved to (made in the pod, before
//! the interface has addresses or is up, so its connected routes land in the VRF's table from
//! the start) and the rules (`ip rule`), added after the routes. Both are objects of the pod's
//! namespace: they die with it, and a detach while the pod lives takes back what knic added
//! (the rules; the VRF once no interface is left in it, so claims of one pod can share one).

use knic_proto::netconfig::RoutingSettings;
pub use knic_proto::netconfig::{Family, Rule, Vrf};
use serde::{Deserialize, Serialize};

use super::{AttachPlan, Kernel, Ns, Session};
use crate::error::{Error, Result};

/// What an attach plan installs besides routes: the expanded rules (the `from <address>`
/// rules of source-based routing first, then the config's) and the VRF.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRouting {
    /// Rules, each of one family.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<Rule>,
    /// The VRF the interface joins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vrf: Option<Vrf>,
}

impl PodRouting {
    /// Nothing to install (skipped in checkpoints).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.vrf.is_none()
    }
}

/// A link of the pod seen as a VRF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VrfLink {
    /// `IFLA_VRF_TABLE`; `None` when the link is not a VRF.
    pub table: Option<u32>,
    /// Names of the links enslaved to it.
    pub members: Vec<String>,
}

/// The plan's routes and routing for a device with `addresses`, from the config's checked
/// `routing` (see [`RoutingSettings::expand`]).
pub fn plan(
    settings: &RoutingSettings,
    addresses: &[knic_proto::netconfig::Cidr],
    routes: &[knic_proto::netconfig::Route],
) -> (Vec<knic_proto::netconfig::Route>, PodRouting) {
    let (routes, rules) = settings.expand(addresses, routes);
    (
        routes,
        PodRouting {
            rules,
            vrf: settings.vrf.clone(),
        },
    )
}

/// `ip rule` style text of a rule, for error contexts.
pub fn describe(rule: &Rule) -> String {
    let mut text = format!("priority {}", rule.priority);
    if let Some(from) = rule.from {
        text.push_str(&format!(" from {from}"));
    }
    if let Some(to) = rule.to {
        text.push_str(&format!(" to {to}"));
    }
    if let Some(iif) = &rule.iif {
        text.push_str(&format!(" iif {iif}"));
    }
    if let Some(oif) = &rule.oif {
        text.push_str(&format!(" oif {oif}"));
    }
    if let Some(mark) = rule.fwmark {
        text.push_str(&format!(" fwmark {mark:#x}"));
        if let Some(mask) = rule.fwmask {
            text.push_str(&format!("/{mask:#x}"));
        }
    }
    let family = match rule.family {
        Family::Ipv4 => "-4",
        Family::Ipv6 => "-6",
    };
    format!("{family} rule {text} lookup {}", rule.table)
}

/// Makes the plan's VRF in the pod if it is missing (one of that name and table is shared,
/// anything else of that name refused) and enslaves the interface to it. Repeatable.
pub(super) async fn join_vrf<S: Session>(plan: &AttachPlan, netns: &Ns, pod: &mut S) -> Result<()> {
    let Some(vrf) = &plan.routing.vrf else {
        return Ok(());
    };
    let what = || format!("putting {} into VRF {}", plan.pod_ifname, vrf.name);
    match pod.vrf(&vrf.name).await? {
        None => {
            pod.add_vrf(vrf).await?;
            crate::failpoint::hit("attach:after-vrf");
        }
        Some(VrfLink {
            table: Some(table), ..
        }) if table == vrf.table => {}
        Some(VrfLink {
            table: Some(table), ..
        }) => {
            return Err(Error::kernel(
                netns,
                what(),
                format!(
                    "VRF {} already exists in the pod with table {table}, not {}; another claim \
                     of this pod uses the name with another table (vrf.table)",
                    vrf.name, vrf.table
                ),
            ));
        }
        Some(VrfLink { table: None, .. }) => {
            return Err(Error::kernel(
                netns,
                what(),
                format!(
                    "a link named {} already exists in the pod and is not a VRF; choose another \
                     vrf.name",
                    vrf.name
                ),
            ));
        }
    }
    pod.set_master(&plan.pod_ifname, &vrf.name).await
}

/// Adds the plan's rules in the pod (after its routes, so a rule never points at a table
/// that is still being filled).
pub(super) async fn add_rules<S: Session>(plan: &AttachPlan, pod: &mut S) -> Result<()> {
    if plan.routing.rules.is_empty() {
        return Ok(());
    }
    pod.add_rules(&plan.routing.rules).await
}

/// Takes back what the plan added to a pod that still lives: its rules, and its VRF once no
/// interface is left in it (the device's own move home releases it: the kernel unlinks a
/// device from its master when it leaves the namespace). Nothing to do when the pod's
/// namespace is gone (its rules and VRF went with it). Repeatable.
pub(super) async fn remove<K: Kernel>(
    kernel: &K,
    plan: &AttachPlan,
    netns: Option<&Ns>,
) -> Result<()> {
    if plan.routing.is_empty() {
        return Ok(());
    }
    let Some(ns) = netns else {
        return Ok(());
    };
    let Some(mut pod) = kernel.open(ns).await? else {
        return Ok(());
    };
    if !plan.routing.rules.is_empty() {
        pod.del_rules(&plan.routing.rules).await?;
        crate::failpoint::hit("detach:after-rules");
    }
    if let Some(vrf) = &plan.routing.vrf
        && let Some(link) = pod.vrf(&vrf.name).await?
        && link.table == Some(vrf.table)
    {
        if link.members.is_empty() {
            pod.del_link(&vrf.name).await?;
        } else {
            tracing::debug!(vrf = %vrf.name, members = ?link.members,
                "VRF still in use by other interfaces of the pod; kept");
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "routing_tests.rs"]
mod tests;
