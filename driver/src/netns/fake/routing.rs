//! The fake kernel's rules and VRF devices, as the real kernel keeps them: rules per
//! namespace (an identical one is `EEXIST`, answered as success by the executor's add; a
//! missing one on delete is fine), a VRF as a link of kind `vrf` with its table, and
//! membership dropped when the member leaves the namespace or the VRF dies.

use super::super::routing::{Rule, Vrf, VrfLink};
use super::*;

impl FakeKernel {
    /// The rules of a namespace, in the order they were added.
    pub fn rules(&self, ns: &Ns) -> Vec<Rule> {
        self.lock().rules.get(ns).cloned().unwrap_or_default()
    }

    /// The VRF `name` of `ns` as the executor reads it.
    pub fn vrf_link(&self, ns: &Ns, name: &str) -> Option<VrfLink> {
        let s = self.lock();
        vrf_of(&s, ns, name)
    }

    /// Makes `name` in `ns` a VRF with `table` (a pod's own, or another claim's).
    pub fn add_vrf_link(&self, ns: &Ns, name: &str, table: u32) {
        self.add_link(ns, name, 65536, [2, 0, 0, 0, 0, 9], Some("vrf"), &[]);
        self.lock()
            .vrf_tables
            .insert((ns.clone(), name.to_owned()), table);
    }
}

fn vrf_of(s: &State, ns: &Ns, name: &str) -> Option<VrfLink> {
    s.links.get(ns)?.iter().find(|l| l.name == name)?;
    let key = (ns.clone(), name.to_owned());
    Some(VrfLink {
        table: s.vrf_tables.get(&key).copied(),
        members: s
            .masters
            .iter()
            .filter(|((n, _), master)| n == ns && **master == name)
            .map(|((_, member), _)| member.clone())
            .collect(),
    })
}

/// What the kernel forgets about `name` in `ns` when it leaves the namespace or dies: its
/// membership, and as a VRF its table and its members' membership.
pub(super) fn forget(s: &mut State, ns: &Ns, name: &str) {
    let key = (ns.clone(), name.to_owned());
    s.masters.remove(&key);
    s.vrf_tables.remove(&key);
    s.masters
        .retain(|(n, _), master| !(n == ns && master == name));
}

impl FakeSession {
    pub(super) fn add_rules_now(&mut self, rules: &[Rule]) -> Result<()> {
        self.sent(rules.len());
        for rule in rules {
            let ns = self.ns.clone();
            let mut s = self.record(format!("rule add {}", rule_text(rule)))?;
            let list = s.rules.entry(ns).or_default();
            if !list.contains(rule) {
                list.push(rule.clone());
            }
        }
        Ok(())
    }

    pub(super) fn del_rules_now(&mut self, rules: &[Rule]) -> Result<()> {
        self.sent(rules.len());
        for rule in rules {
            let ns = self.ns.clone();
            let mut s = self.record(format!("rule del {}", rule_text(rule)))?;
            if let Some(list) = s.rules.get_mut(&ns) {
                list.retain(|r| r != rule);
            }
        }
        Ok(())
    }

    pub(super) fn vrf_now(&mut self, name: &str) -> Result<Option<VrfLink>> {
        self.sent(1);
        self.read("link show")?;
        let s = self.kernel.lock();
        Ok(vrf_of(&s, &self.ns, name))
    }

    pub(super) fn add_vrf_now(&mut self, vrf: &Vrf) -> Result<()> {
        self.sent(1);
        let ns = self.ns.clone();
        let mut s = self.record(format!(
            "link add {} type vrf table {} up",
            vrf.name, vrf.table
        ))?;
        if find(&mut s, &ns, &vrf.name).is_some() {
            return Err(Error::io(
                format!("creating VRF {}", vrf.name),
                std::io::Error::other("File exists"),
            ));
        }
        s.next_index += 1;
        let index = s.next_index;
        s.links.entry(ns.clone()).or_default().push(LinkState {
            index,
            name: vrf.name.clone(),
            mtu: 65575,
            mac: None,
            up: true,
            addresses: Vec::new(),
            kind: Some("vrf".into()),
            permanent_mac: None,
            pci_address: None,
        });
        s.vrf_tables.insert((ns, vrf.name.clone()), vrf.table);
        Ok(())
    }

    pub(super) fn set_master_now(&mut self, name: &str, master: &str) -> Result<()> {
        self.lookup(name);
        self.lookup(master);
        self.sent(1);
        let ns = self.ns.clone();
        let mut s = self.record(format!("link set {name} master {master}"))?;
        if find(&mut s, &ns, name).is_none() {
            drop(s);
            return Err(self.missing(name));
        }
        if find(&mut s, &ns, master).is_none() {
            drop(s);
            return Err(self.missing(master));
        }
        s.masters.insert((ns, name.to_owned()), master.to_owned());
        Ok(())
    }
}

/// `ip rule` text of a rule, for the log.
fn rule_text(rule: &Rule) -> String {
    super::super::routing::describe(rule)
}
