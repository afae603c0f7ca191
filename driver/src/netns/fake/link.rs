//! The fake kernel's issue-27 link settings: static neighbors, kept per (namespace, link) and
//! dropped, as the kernel drops them, when the link leaves the namespace or dies.

use std::net::IpAddr;

use knic_proto::netconfig::{Neighbor, OffloadSizes};

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

/// What a link reports before anything set its sizes: 64 KiB each, as veth and most drivers.
const DEFAULT_SIZE: u32 = 65_536;

impl FakeKernel {
    /// Makes this kernel one from before Linux 6.3: it reports no IPv4 GSO/GRO sizes and
    /// ignores them in requests, silently, as rtnetlink ignores attributes it does not know.
    pub fn without_ipv4_sizes(&self) {
        self.lock().no_ipv4_sizes = true;
    }

    /// The GSO/GRO sizes `ifname` in `ns` reports (`None` for a link that does not exist).
    pub fn sizes(&self, ns: &Ns, ifname: &str) -> Option<OffloadSizes> {
        let mut s = self.lock();
        find(&mut s, ns, ifname)?;
        Some(reported(&s, ns, ifname))
    }

    /// Gives `ifname` in `ns` the sizes `sizes` sets, as its driver might have them.
    pub fn set_sizes(&self, ns: &Ns, ifname: &str, sizes: &OffloadSizes) {
        apply_sizes(&mut self.lock(), ns, ifname, sizes);
    }
}

fn reported(s: &State, ns: &Ns, ifname: &str) -> OffloadSizes {
    let set = s
        .sizes
        .get(&(ns.clone(), ifname.to_owned()))
        .copied()
        .unwrap_or_default();
    let ipv4 = |v: Option<u32>| (!s.no_ipv4_sizes).then(|| v.unwrap_or(DEFAULT_SIZE));
    OffloadSizes {
        gso_max_size: Some(set.gso_max_size.unwrap_or(DEFAULT_SIZE)),
        gro_max_size: Some(set.gro_max_size.unwrap_or(DEFAULT_SIZE)),
        gso_ipv4_max_size: ipv4(set.gso_ipv4_max_size),
        gro_ipv4_max_size: ipv4(set.gro_ipv4_max_size),
    }
}

/// Applies the sizes a request carried (the IPv4 ones ignored by a kernel without them).
pub(super) fn apply_sizes(s: &mut State, ns: &Ns, ifname: &str, sizes: &OffloadSizes) {
    if sizes.is_empty() {
        return;
    }
    let old_kernel = s.no_ipv4_sizes;
    let entry = s.sizes.entry((ns.clone(), ifname.to_owned())).or_default();
    let pairs = [
        (&mut entry.gso_max_size, sizes.gso_max_size, false),
        (&mut entry.gro_max_size, sizes.gro_max_size, false),
        (&mut entry.gso_ipv4_max_size, sizes.gso_ipv4_max_size, true),
        (&mut entry.gro_ipv4_max_size, sizes.gro_ipv4_max_size, true),
    ];
    for (slot, value, ipv4) in pairs {
        if value.is_some() && !(ipv4 && old_kernel) {
            *slot = value;
        }
    }
}

/// The sizes belong to the device: they follow it to another namespace or name.
pub(super) fn carry_sizes(s: &mut State, from: (Ns, String), to: (Ns, String)) {
    if let Some(sizes) = s.sizes.remove(&from) {
        s.sizes.insert(to, sizes);
    }
}

/// `gso_max_size N gro_max_size N …` of a request, for the log.
pub(super) fn describe_sizes(sizes: &OffloadSizes) -> Vec<String> {
    let names = [
        "gso_max_size",
        "gro_max_size",
        "gso_ipv4_max_size",
        "gro_ipv4_max_size",
    ];
    names
        .iter()
        .zip(sizes.fields())
        .filter_map(|(name, (_, v))| v.map(|v| format!("{name} {v}")))
        .collect()
}

impl FakeSession {
    pub(super) fn offload_sizes_now(&mut self, name: &str) -> Result<Option<OffloadSizes>> {
        self.known.remove(name);
        self.lookup(name);
        self.read("link show")?;
        let ns = self.ns.clone();
        Ok(self.kernel.sizes(&ns, name))
    }
}
