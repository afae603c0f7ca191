//! A recording fake kernel: namespaces with links, addresses, routes and sysctls in memory,
//! every operation logged as a line, and failures injectable. It models the kernel behaviour
//! the executor relies on (a move flushes addresses and routes and brings the link down; a move
//! onto a name taken in the target moves the device anyway and then fails the rename, as Linux
//! does, and so does one whose MAC or MTU the device refuses (see [`FakeKernel::limit_mtu`]);
//! a deleted namespace hands physical devices back to the host under
//! a free name and destroys virtual ones), so attach/detach/undo logic is tested without root,
//! and what this kernel cannot do (VLAN without 8021q) is asserted at the message level.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use knic_proto::netconfig::{Cidr, Route};

use super::vf::VfState;
use super::{AttachMode, AttachPlan, Kernel, LinkChange, LinkState, Ns, Tbf};
use crate::error::{Error, Result};

mod ethtool;
mod link;
mod overlay;
mod routing;
mod session;

pub use ethtool::FakeEthtool;

#[derive(Debug, Default)]
struct State {
    links: BTreeMap<Ns, Vec<LinkState>>,
    routes: BTreeMap<Ns, Vec<(String, Route)>>,
    sysctls: BTreeMap<(Ns, String, String), String>,
    /// VF settings by (PF name, VF index): the PF holds them, whichever namespace the VF's
    /// netdev is in.
    vfs: BTreeMap<(String, u32), VfState>,
    /// Settings a PF's driver refuses: (PF, the claim field as `vf::settings` names it) →
    /// errno.
    vf_refusals: BTreeMap<(String, String), i32>,
    /// VF netdevs, by PCI function: (PF, VF index).
    vf_netdevs: BTreeMap<String, (String, u32)>,
    /// PFs that enforce a MAC they assigned, as igb does: while one is assigned, the VF may not
    /// give its netdev another (unless trusted), and adopts it (as its current and permanent
    /// MAC) when its driver resets, which igbvf does when the netdev is opened.
    enforcing: BTreeSet<String>,
    /// VFs whose MAC their PF assigned (not merely learnt from the VF).
    assigned_macs: BTreeSet<(String, u32)>,
    /// Root TBFs by (namespace, link name); the kernel drops them when a link changes
    /// namespace or dies.
    qdiscs: BTreeMap<(Ns, String), Tbf>,
    /// Permanent neighbor entries by (namespace, link name): the kernel flushes them when the
    /// link changes namespace or dies.
    neighbors: BTreeMap<(Ns, String), BTreeMap<std::net::IpAddr, [u8; 6]>>,
    /// GSO/GRO sizes set on links, by (namespace, link name); they follow the device.
    sizes: BTreeMap<(Ns, String), knic_proto::netconfig::OffloadSizes>,
    /// A kernel before 6.3: no IPv4 GSO/GRO sizes (see [`FakeKernel::without_ipv4_sizes`]).
    no_ipv4_sizes: bool,
    log: Vec<String>,
    /// Netlink requests the real kernel would have been sent (see [`FakeSession::lookup`]).
    requests: u64,
    fail: Vec<(String, String)>,
    /// MTU range (min, max) by ifindex, for links given one; others take any MTU.
    mtu_range: BTreeMap<u32, (u32, u32)>,
    next_index: u32,
    /// Child link → the link it sits on: deleting a link deletes its children, as the kernel
    /// does (a macvlan dies with its VLAN).
    lower: Vec<((Ns, String), (Ns, String))>,
    /// VXLAN devices by (namespace, name): what they were made with and their forwarding
    /// entries, which die with them.
    vxlans: BTreeMap<(Ns, String), overlay::Vxlan>,
    /// Policy rules by namespace.
    rules: BTreeMap<Ns, Vec<super::routing::Rule>>,
    /// VRF devices' tables by (namespace, name).
    vrf_tables: BTreeMap<(Ns, String), u32>,
    /// (namespace, member) → its VRF.
    masters: BTreeMap<(Ns, String), String>,
    /// ethtool models by ifindex (see [`FakeEthtool`]).
    ethtool: BTreeMap<u32, FakeEthtool>,
}

/// An attach plan that moves `host_ifname` of `device` (pool `node-a`, request `nic`) into the
/// pod as `pod_ifname` with MTU 9000 and `addresses`: the one plan builder of the executor's and
/// the hooks' tests, which change what they need with struct update syntax.
pub(crate) fn plan(
    device: &str,
    host_ifname: &str,
    pod_ifname: &str,
    addresses: &[&str],
) -> AttachPlan {
    AttachPlan {
        network: None,
        from_template: false,
        addressing: Default::default(),
        pool: "node-a".into(),
        device: device.into(),
        request: "nic".into(),
        host_ifname: host_ifname.into(),
        mode: AttachMode::Move,
        pod_ifname: pod_ifname.into(),
        mtu: Some(9000),
        mac: None,
        addresses: addresses.iter().filter_map(|a| a.parse().ok()).collect(),
        routes: vec![],
        sysctls: BTreeMap::new(),
        identity: None,
        vf: None,
        bandwidth: None,
        routing: Default::default(),
        ethtool: None,
        link: Default::default(),
    }
}

/// The fake; clones share state.
#[derive(Debug, Clone)]
pub struct FakeKernel {
    state: Arc<Mutex<State>>,
}

impl Default for FakeKernel {
    fn default() -> Self {
        FakeKernel::new()
    }
}

impl FakeKernel {
    /// A kernel with an empty host namespace.
    pub fn new() -> Self {
        let mut state = State {
            next_index: 10,
            ..Default::default()
        };
        state.links.insert(Ns::Host, Vec::new());
        FakeKernel {
            state: Arc::new(Mutex::new(state)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a link; `kind` `None` means a physical device.
    pub fn add_link(
        &self,
        ns: &Ns,
        name: &str,
        mtu: u32,
        mac: [u8; 6],
        kind: Option<&str>,
        addresses: &[Cidr],
    ) -> u32 {
        let mut s = self.lock();
        s.next_index += 1;
        let index = s.next_index;
        s.links.entry(ns.clone()).or_default().push(LinkState {
            index,
            name: name.into(),
            mtu,
            mac: Some(mac),
            up: true,
            addresses: addresses.to_vec(),
            kind: kind.map(str::to_string),
            permanent_mac: None,
            pci_address: None,
        });
        index
    }

    /// Gives the link `name` in `ns` the ifindex `index` (indexes are per namespace, so a
    /// pod's link can carry the same one as a host link).
    pub fn renumber(&self, ns: &Ns, name: &str, index: u32) {
        let mut s = self.lock();
        if let Some(link) = s
            .links
            .get_mut(ns)
            .and_then(|links| links.iter_mut().find(|l| l.name == name))
        {
            link.index = index;
        }
    }

    /// Gives the link `name` in `ns` a permanent MAC and a PCI function, like a NIC port.
    pub fn set_hardware(&self, ns: &Ns, name: &str, permanent_mac: [u8; 6], pci: &str) {
        let mut s = self.lock();
        if let Some(link) = s
            .links
            .get_mut(ns)
            .and_then(|links| links.iter_mut().find(|l| l.name == name))
        {
            link.permanent_mac = Some(permanent_mac);
            link.pci_address = Some(pci.to_owned());
        }
    }

    /// Gives the link `name` in `ns` the MTU range of its driver: a change outside it is
    /// refused, as the kernel refuses it (also inside a move, once the device has moved).
    pub fn limit_mtu(&self, ns: &Ns, name: &str, min: u32, max: u32) {
        let mut s = self.lock();
        if let Some(index) = find(&mut s, ns, name).map(|l| l.index) {
            s.mtu_range.insert(index, (min, max));
        }
    }

    /// Sets the link `name` in `ns` administratively down.
    pub fn set_down(&self, ns: &Ns, name: &str) {
        let mut s = self.lock();
        if let Some(link) = find(&mut s, ns, name) {
            link.up = false;
        }
    }

    /// Creates a pod namespace.
    pub fn add_namespace(&self, ns: &Ns) {
        self.lock().links.entry(ns.clone()).or_default();
    }

    /// Deletes a pod namespace the way the kernel does: physical devices return to the host
    /// (down, addresses gone, renamed `dev<index>` if their name is taken), virtual ones die.
    pub fn delete_namespace(&self, ns: &Ns) {
        let mut s = self.lock();
        let links = s.links.remove(ns).unwrap_or_default();
        s.routes.remove(ns);
        s.qdiscs.retain(|(n, _), _| n != ns);
        s.rules.remove(ns);
        s.vrf_tables.retain(|(n, _), _| n != ns);
        s.masters.retain(|(n, _), _| n != ns);
        s.neighbors.retain(|(n, _), _| n != ns);
        // A virtual link dying takes what sits on it along: a veth's host end with its pod end.
        let dying: Vec<(Ns, String)> = links
            .iter()
            .filter(|l| l.kind.is_some())
            .map(|l| (ns.clone(), l.name.clone()))
            .collect();
        let along: Vec<(Ns, String)> = s
            .lower
            .iter()
            .filter(|(child, lower)| dying.contains(lower) && child.0 != *ns)
            .map(|(child, _)| child.clone())
            .collect();
        for (n, name) in &along {
            if let Some(l) = s.links.get_mut(n) {
                l.retain(|l| l.name != *name);
            }
            s.vxlans.remove(&(n.clone(), name.clone()));
        }
        s.lower.retain(|(child, lower)| {
            !dying.contains(child) && !dying.contains(lower) && !along.contains(child)
        });
        for mut link in links.into_iter().filter(|l| l.kind.is_none()) {
            let old_name = link.name.clone();
            let host = s.links.entry(Ns::Host).or_default();
            if host.iter().any(|h| h.name == link.name) {
                link.name = format!("dev{}", link.index);
            }
            link.up = false;
            link.addresses.clear();
            let new_name = link.name.clone();
            host.push(link);
            link::carry_sizes(&mut s, (ns.clone(), old_name), (Ns::Host, new_name));
        }
    }

    /// Makes the next operation whose log line starts with `prefix` fail with `message`.
    pub fn fail_on(&self, prefix: &str, message: &str) {
        self.lock().fail.push((prefix.into(), message.into()));
    }

    /// Netlink requests so far, counted as `rtnl` sends them: a read or dump is one, a
    /// change is one per object, and the first use of a name in a session adds its lookup.
    pub fn requests(&self) -> u64 {
        self.lock().requests
    }

    /// Every operation so far, one line each.
    pub fn log(&self) -> Vec<String> {
        self.lock().log.clone()
    }

    /// Links of a namespace.
    pub fn links(&self, ns: &Ns) -> Vec<LinkState> {
        self.lock().links.get(ns).cloned().unwrap_or_default()
    }

    /// Routes of a namespace as `(ifname, route)`.
    pub fn routes(&self, ns: &Ns) -> Vec<(String, Route)> {
        self.lock().routes.get(ns).cloned().unwrap_or_default()
    }

    /// Gives the host link `pf` a VF `index` in `state` (a PF reports every setting).
    pub fn add_vf(&self, pf: &str, index: u32, state: VfState) {
        self.lock().vfs.insert((pf.to_owned(), index), state);
    }

    /// Makes `pf` a PF whose driver cannot set trust (EOPNOTSUPP).
    pub fn refuse_trust(&self, pf: &str) {
        self.refuse_vf_setting(pf, "vf.trust", nix::libc::EOPNOTSUPP);
    }

    /// Makes `pf`'s driver answer `errno` to the setting `field` (as [`super::vf::settings`]
    /// names it, e.g. `vf.linkState`).
    pub fn refuse_vf_setting(&self, pf: &str, field: &str, errno: i32) {
        self.lock()
            .vf_refusals
            .insert((pf.to_owned(), field.to_owned()), errno);
    }

    /// Makes `pf` a PF driven like igb (Intel 82576/I350), as the test VM showed it: no link
    /// state (EOPNOTSUPP), no minimum rate (EINVAL), no 802.1ad (EPROTONOSUPPORT), and a MAC
    /// it assigns is enforced (see `State::enforcing`).
    pub fn igb(&self, pf: &str) {
        use nix::libc::{EINVAL, EOPNOTSUPP, EPROTONOSUPPORT};
        self.refuse_vf_setting(pf, "vf.linkState", EOPNOTSUPP);
        self.refuse_vf_setting(pf, "vf.minTxRate/vf.maxTxRate", EINVAL);
        self.refuse_vf_setting(pf, "vf.vlanProtocol", EPROTONOSUPPORT);
        self.lock().enforcing.insert(pf.to_owned());
    }

    /// Makes the link `name` in `ns` VF `index` of `pf`, on the PCI function `pci` (its
    /// permanent MAC unset, as igbvf leaves it until a reset under an assigned MAC).
    pub fn vf_netdev(&self, ns: &Ns, name: &str, pf: &str, index: u32, pci: &str) {
        let mut s = self.lock();
        if let Some(link) = find(&mut s, ns, name) {
            link.pci_address = Some(pci.to_owned());
        }
        s.vf_netdevs.insert(pci.to_owned(), (pf.to_owned(), index));
    }

    /// VF `index` of `pf` as the PF holds it now.
    pub fn vf(&self, pf: &str, index: u32) -> Option<VfState> {
        self.lock().vfs.get(&(pf.to_owned(), index)).cloned()
    }

    /// The root TBF of `ifname` in `ns`, if it has one.
    pub fn egress_limit(&self, ns: &Ns, ifname: &str) -> Option<Tbf> {
        self.lock()
            .qdiscs
            .get(&(ns.clone(), ifname.to_owned()))
            .copied()
    }

    /// A sysctl value set through the fake.
    pub fn sysctl(&self, ns: &Ns, ifname: &str, key: &str) -> Option<String> {
        self.lock()
            .sysctls
            .get(&(ns.clone(), ifname.into(), key.into()))
            .cloned()
    }
}

/// A session in one fake namespace.
pub struct FakeSession {
    kernel: FakeKernel,
    ns: Ns,
    /// Names whose ifindex this session has looked up, as `rtnl` caches them.
    known: std::collections::HashSet<String>,
}

use super::mac_text;

fn describe(change: &LinkChange) -> String {
    let mut parts = Vec::new();
    if let Some(n) = &change.name {
        parts.push(format!("name {n}"));
    }
    if let Some(m) = change.mtu {
        parts.push(format!("mtu {m}"));
    }
    if let Some(mac) = &change.mac {
        parts.push(format!("address {}", mac_text(mac)));
    }
    match change.up {
        Some(true) => parts.push("up".into()),
        Some(false) => parts.push("down".into()),
        None => {}
    }
    if !change.ipv4_conf.is_empty() {
        let conf: Vec<String> = change
            .ipv4_conf
            .iter()
            .map(|(id, v)| format!("{}={}", devconf_key(*id), v.cast_signed()))
            .collect();
        parts.push(format!("ipv4conf {}", conf.join(",")));
    }
    parts.extend(link::describe_sizes(&change.sizes));
    parts.join(" ")
}

/// The sysctl key a devconf id is recorded under (as a plan spells it).
fn devconf_key(id: u16) -> String {
    match super::sysctl::devconf_name(id) {
        Some(name) => format!("ipv4.{name}"),
        None => format!("ipv4.devconf{id}"),
    }
}

/// Records the IPv4 sysctls a link request carried, as a sysctl file write would.
fn set_ipv4_conf(s: &mut State, ns: &Ns, ifname: &str, change: &LinkChange) {
    for (id, value) in &change.ipv4_conf {
        s.sysctls.insert(
            (ns.clone(), ifname.to_owned(), devconf_key(*id)),
            value.cast_signed().to_string(),
        );
    }
}

impl FakeSession {
    /// Counts `n` requests.
    fn sent(&self, n: usize) {
        self.kernel.lock().requests += n as u64;
    }

    /// Counts the index lookup of `name` unless this session already made it (a missing
    /// link is not remembered).
    fn lookup(&mut self, name: &str) {
        if self.known.contains(name) {
            return;
        }
        let mut s = self.kernel.lock();
        s.requests += 1;
        let ns = self.ns.clone();
        if find(&mut s, &ns, name).is_some() {
            self.known.insert(name.to_owned());
        }
    }

    /// Logs the operation and returns the injected failure for it, if any.
    fn record(&self, line: String) -> Result<MutexGuard<'_, State>> {
        let mut s = self.kernel.lock();
        let line = format!("{}: {line}", self.ns);
        s.log.push(line.clone());
        injected(&mut s, line)?;
        Ok(s)
    }

    /// The injected failure for a read (`<ns>: link show`); reads are not logged.
    fn read(&self, what: &str) -> Result<()> {
        injected(&mut self.kernel.lock(), format!("{}: {what}", self.ns))
    }

    fn missing(&self, name: &str) -> Error {
        Error::kernel(
            &self.ns,
            format!("looking up {name}"),
            format!("interface {name} does not exist"),
        )
    }
}

/// The failure injected for the operation `line` (consumed), if any.
fn injected(s: &mut State, line: String) -> Result<()> {
    match s
        .fail
        .iter()
        .position(|(p, _)| line.starts_with(p.as_str()))
    {
        Some(pos) => {
            let (_, message) = s.fail.remove(pos);
            Err(Error::io(line, std::io::Error::other(message)))
        }
        None => Ok(()),
    }
}

fn find<'a>(s: &'a mut State, ns: &Ns, name: &str) -> Option<&'a mut LinkState> {
    s.links.get_mut(ns)?.iter_mut().find(|l| l.name == name)
}

/// Applies `change` to `link` in the kernel's order (do_setlink: MAC, MTU, name, admin
/// state), stopping at the first attribute refused: what came before it stays, and the
/// refusal is returned as the kernel words it. A MAC is refused when it is multicast or zero
/// (`is_valid_ether_addr`), an MTU outside the link's range, a name when `name_taken`.
/// The VF `link` is, if its PF enforces a MAC it assigned to it (see `State::enforcing`), with
/// whether the VF may still change its own (it is trusted, or nothing is assigned).
fn enforced_vf(s: &State, link: &LinkState) -> Option<((String, u32), bool)> {
    let vf = s.vf_netdevs.get(link.pci_address.as_ref()?)?.clone();
    if !s.enforcing.contains(&vf.0) {
        return None;
    }
    let trusted = s.vfs.get(&vf).and_then(|v| v.trust) == Some(true);
    let free = trusted || !s.assigned_macs.contains(&vf);
    Some((vf, free))
}

/// A MAC change of a VF netdev as its PF sees it: refused while the PF enforces one it
/// assigned (the VF's request is NACKed: EADDRNOTAVAIL), else learnt as the VF's MAC in the
/// PF's table. A change to the MAC the link has is no request at all (the kernel skips it).
fn vf_mac_change(s: &mut State, link: &LinkState, change: &LinkChange) -> bool {
    let Some(mac) = change.mac.filter(|m| link.mac != Some(*m)) else {
        return true;
    };
    match enforced_vf(s, link) {
        Some((_, false)) => false,
        Some((vf, true)) => {
            if let Some(state) = s.vfs.get_mut(&vf) {
                state.mac = Some(mac);
            }
            true
        }
        None => true,
    }
}

/// The VF driver's reset when its netdev opens: under a MAC its PF assigned, that MAC becomes
/// the netdev's current and permanent one (igbvf).
fn vf_opened(s: &State, link: &mut LinkState) {
    let Some((vf, _)) = enforced_vf(s, link) else {
        return;
    };
    if !s.assigned_macs.contains(&vf) {
        return;
    }
    if let Some(mac) = s.vfs.get(&vf).and_then(|v| v.mac) {
        link.mac = Some(mac);
        link.permanent_mac = Some(mac);
    }
}

fn apply(
    link: &mut LinkState,
    change: &LinkChange,
    mtu_range: Option<(u32, u32)>,
    name_taken: bool,
    mac_allowed: bool,
) -> std::result::Result<(), &'static str> {
    if let Some(mac) = change.mac {
        if mac[0] & 1 == 1 || mac == [0; 6] || !mac_allowed {
            return Err("Cannot assign requested address");
        }
        link.mac = Some(mac);
    }
    if let Some(m) = change.mtu {
        match mtu_range {
            Some((min, _)) if m < min => return Err("mtu less than device minimum"),
            Some((_, max)) if m > max => return Err("mtu greater than device maximum"),
            _ => {}
        }
        link.mtu = m;
    }
    if let Some(n) = &change.name {
        if name_taken && *n != link.name {
            return Err("File exists");
        }
        link.name = n.clone();
    }
    if let Some(up) = change.up {
        link.up = up;
    }
    Ok(())
}

impl Kernel for FakeKernel {
    type Session = FakeSession;

    async fn open(&self, ns: &Ns) -> Result<Option<FakeSession>> {
        if !self.lock().links.contains_key(ns) {
            return Ok(None);
        }
        Ok(Some(FakeSession {
            kernel: self.clone(),
            ns: ns.clone(),
            known: std::collections::HashSet::new(),
        }))
    }
}

impl FakeSession {
    fn add_address(&self, name: &str, address: Cidr) -> Result<()> {
        let ns = self.ns.clone();
        let mut s = self.record(format!("addr add {address} dev {name}"))?;
        match find(&mut s, &ns, name) {
            Some(link) => {
                if !link.addresses.contains(&address) {
                    link.addresses.push(address);
                }
                Ok(())
            }
            None => {
                drop(s);
                Err(self.missing(name))
            }
        }
    }

    fn del_route(&self, name: &str, route: &Route) -> Result<()> {
        let ns = self.ns.clone();
        let via = route
            .gateway
            .map(|g| format!(" via {g}"))
            .unwrap_or_default();
        let mut s = self.record(format!("route del {}{via} dev {name}", route.destination))?;
        if let Some(routes) = s.routes.get_mut(&ns) {
            // Like the kernel's ESRCH, which knic takes as done: a route already gone is fine.
            routes.retain(|(dev, r)| !(dev == name && r == route));
        }
        Ok(())
    }

    fn add_route(&self, name: &str, route: &Route) -> Result<()> {
        let ns = self.ns.clone();
        let via = route
            .gateway
            .map(|g| format!(" via {g}"))
            .unwrap_or_default();
        let mut s = self.record(format!("route add {}{via} dev {name}", route.destination))?;
        let up = find(&mut s, &ns, name).map(|l| l.up);
        match up {
            None => {
                drop(s);
                Err(self.missing(name))
            }
            Some(false) => Err(Error::io(
                format!("adding route via {name}"),
                std::io::Error::other("Network is down"),
            )),
            Some(true) => {
                // The kernel answers EEXIST for the same route again, which knic takes as done.
                let routes = s.routes.entry(ns).or_default();
                if !routes.iter().any(|(dev, r)| dev == name && r == route) {
                    routes.push((name.into(), *route));
                }
                Ok(())
            }
        }
    }
}
