//! What the policy asks of each PF, decided without touching anything: a pure function of the
//! policy, the PFs as sysfs shows them, the VFs prepared for claims and the default-route
//! interfaces, so every rule is tested on its own.

use std::collections::{BTreeMap, BTreeSet};

use super::pf::PfFacts;
use super::policy::{PfSubject, SriovPolicy, VfDriver};
use crate::error::Error;

/// The vfio-pci driver's name, as sysfs and `driver_override` spell it.
pub const VFIO_PCI: &str = "vfio-pci";

/// What to do to one PF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PfPlan {
    /// The PF as read.
    pub pf: PfFacts,
    /// The policy entry that selected it.
    pub entry: String,
    /// The VF count to write, when it differs from the current one.
    pub num_vfs: Option<NumVfs>,
    /// The driver its VFs should be bound to.
    pub vf_driver: VfDriver,
}

/// A change of `sriov_numvfs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NumVfs {
    /// The count now.
    pub from: u32,
    /// The count wanted.
    pub to: u32,
}

/// The decision for every PF the policy names.
#[derive(Debug, Default)]
pub struct Decision {
    /// PFs to act on (possibly only to check their VFs' drivers).
    pub plans: Vec<PfPlan>,
    /// PFs the policy names that are left alone, each with the rule (an [`Error::Sriov`]).
    pub refused: Vec<Error>,
    /// Entries that match no PF of this node: normal for a fleet-wide policy.
    pub unmatched: Vec<String>,
    /// PF PCI address → the entry that selected it (the first, when several did), whether or
    /// not it could be changed now: its VFs belong to that pool either way.
    pub pools: BTreeMap<String, String>,
}

/// Decides, for every PF an entry selects, whether and how its VF count changes.
///
/// `held` maps a PF's PCI address to the claims (`namespace/name`) that hold it or its VFs;
/// `routes` maps the PCI address of a PF the node's default routes depend on (it carries one,
/// or is a slave or lower device of an interface that does) to why.
pub fn decide(
    policy: &SriovPolicy,
    pfs: &[PfFacts],
    held: &BTreeMap<String, BTreeSet<String>>,
    routes: &BTreeMap<String, String>,
) -> Decision {
    let mut decision = Decision::default();
    let mut chosen: BTreeMap<&str, &str> = BTreeMap::new();
    for entry in &policy.pools {
        let mut matched = false;
        for pf in pfs {
            let subject = PfSubject {
                names: &pf.names,
                pci_address: &pf.pci_address,
                pci_id: pf.pci_id,
            };
            if !entry.matches(&subject) {
                continue;
            }
            matched = true;
            if let Some(first) = chosen.get(pf.pci_address.as_str()) {
                decision.refused.push(refuse(
                    pf,
                    format!(
                        "selected by policy entries {first} and {}; one entry per PF (the first \
                         one applies)",
                        entry.name
                    ),
                ));
                continue;
            }
            chosen.insert(&pf.pci_address, &entry.name);
            match decide_one(pf, entry.num_vfs, held, routes) {
                Ok(num_vfs) => decision.plans.push(PfPlan {
                    pf: pf.clone(),
                    entry: entry.name.clone(),
                    num_vfs,
                    vf_driver: entry.vf_driver,
                }),
                Err(rule) => decision.refused.push(refuse(pf, rule)),
            }
        }
        if !matched {
            decision.unmatched.push(entry.name.clone());
        }
    }
    decision.pools = chosen
        .into_iter()
        .map(|(pf, entry)| (pf.to_owned(), entry.to_owned()))
        .collect();
    decision
}

fn decide_one(
    pf: &PfFacts,
    want: u32,
    held: &BTreeMap<String, BTreeSet<String>>,
    routes: &BTreeMap<String, String>,
) -> Result<Option<NumVfs>, String> {
    let Some(total) = pf.total_vfs else {
        return Err(
            "not SR-IOV capable (no sriov_totalvfs, or it is 0); numVfs cannot be set".to_owned(),
        );
    };
    if want > total {
        return Err(format!(
            "numVfs {want} is over sriov_totalvfs {total}, the most this PF supports"
        ));
    }
    let from = pf.num_vfs.unwrap_or(0);
    if from == want {
        return Ok(None);
    }
    if let Some(why) = routes.get(&pf.pci_address) {
        return Err(format!(
            "{why}; changing its VF count can reset the link and cut the node off, so knic \
             leaves it at {from} VFs"
        ));
    }
    if let Some(claims) = held.get(&pf.pci_address).filter(|c| !c.is_empty()) {
        // Also with no VFs now: then the PF itself is prepared (in a pod, or on vfio-pci),
        // and creating VFs would reset it under its pod.
        let claims: Vec<&str> = claims.iter().map(String::as_str).collect();
        return Err(format!(
            "numVfs {want} wanted, but it or its VFs are prepared for claims {}; changing the \
             count goes through 0 and would destroy them, so it stays at {from} until they are \
             released",
            claims.join(", ")
        ));
    }
    Ok(Some(NumVfs { from, to: want }))
}

fn refuse(pf: &PfFacts, reason: String) -> Error {
    Error::Sriov {
        pf: pf.label(),
        reason,
    }
}

/// The VFs of `plan` whose driver binding differs from what the policy wants, leaving alone
/// the ones claims hold (a claim's own `deviceMode` decides those) — by PCI address.
pub fn rebind(plan: &PfPlan, held_vfs: &BTreeSet<String>) -> Vec<String> {
    plan.pf
        .vfs
        .iter()
        .filter(|vf| !held_vfs.contains(&vf.pci_address))
        .filter(|vf| match plan.vf_driver {
            VfDriver::VfioPci => vf.driver.as_deref() != Some(VFIO_PCI),
            // Only undo what a vfio policy did: a VF someone else bound stays as it is.
            VfDriver::Netdev => vf.driver_override.as_deref() == Some(VFIO_PCI),
        })
        .map(|vf| vf.pci_address.clone())
        .collect()
}
