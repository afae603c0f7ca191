//! The fake kernel's issue-27 link settings: static neighbors, kept per (namespace, link) and
//! dropped, as the kernel drops them, when the link leaves the namespace or dies.

use std::net::IpAddr;

use knic_proto::netconfig::Neighbor;

use super::super::link::describe_neighbor;
use super::*;

impl FakeKernel {
    /// The permanent neighbor entries of `ifname` in `ns` (address → MAC).
    pub fn neighbors(&self, ns: &Ns, ifname: &str) -> BTreeMap<IpAddr, [u8; 6]> {
        self.lock()
            .neighbors
            .get(&(ns.clone(), ifname.to_owned()))
            .cloned()
            .unwrap_or_default()
    }
}

impl FakeSession {
    pub(super) fn set_neighbors_now(&mut self, name: &str, neighbors: &[Neighbor]) -> Result<()> {
        if neighbors.is_empty() {
            return Ok(());
        }
        self.lookup(name);
        self.sent(neighbors.len());
        let ns = self.ns.clone();
        for neighbor in neighbors {
            let mut s = self.record(format!(
                "neigh replace {} nud permanent dev {name}",
                describe_neighbor(neighbor)
            ))?;
            if find(&mut s, &ns, name).is_none() {
                drop(s);
                return Err(self.missing(name));
            }
            s.neighbors
                .entry((ns.clone(), name.to_owned()))
                .or_default()
                .insert(neighbor.address, neighbor.hardware_address);
        }
        Ok(())
    }
}
