//! The discovery walk: gather sysfs facts about netdevs and PCI network functions, classify
//! them, attach attributes, then decide what is offered.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use attrs::Attrs;
use decide::decide;
pub(crate) use par::par_map;
use ports::{is_representor_port, is_uplink_port, is_zero_mac};

use super::filter::Filter;
use super::names::{netdev_device_name, pci_device_name};
use super::pciids::PciNames;
use super::sources::{LinkInfo, Sources};
use super::sysfs::Sysfs;
use super::{ATTR_PCI_BUS_ID, ATTR_PCIE_ROOT, DeviceKind, Inventory, NetDevice};

/// ARPHRD_LOOPBACK.
const ARPHRD_LOOPBACK: i64 = 772;
/// IFF_LOOPBACK.
const IFF_LOOPBACK: u32 = 0x8;
/// IFF_UP: the link is administratively up.
const IFF_UP: u32 = 0x1;
/// How far to walk up from a netdev's `device` through non-PCI buses (virtio) to its function.
const MAX_PARENT_WALK: usize = 4;

/// Sysfs (and netlink) facts about one netdev.
#[derive(Debug)]
struct Netdev {
    name: String,
    /// Root-relative real directory (`sys/devices/.../net/<name>`).
    real: PathBuf,
    /// The PCI function owning it, through `device` (and virtio) links.
    pci: Option<String>,
    /// Whether it is a software device (no `device` link, or under `devices/virtual`).
    is_virtual: bool,
    is_loopback: bool,
    phys_port_name: Option<String>,
    dev_port: i64,
    /// Driver of a non-PCI parent device (USB, auxiliary, …).
    parent_driver: Option<String>,
    link: Option<LinkInfo>,
    /// The attributes every netdev candidate carries, read with the classification facts so
    /// the netdev's directory is opened once per pass.
    facts: NetdevFacts,
}

/// A netdev's own attribute files.
#[derive(Debug, Default)]
struct NetdevFacts {
    address: Option<String>,
    mtu: Option<i64>,
    operstate: Option<String>,
    flags: Option<u32>,
    speed: Option<i64>,
}

/// Sysfs facts about one PCI network function.
#[derive(Debug, Default)]
struct PciFn {
    bdf: String,
    real: PathBuf,
    vendor: Option<u16>,
    device: Option<u16>,
    sub_vendor: Option<u16>,
    sub_device: Option<u16>,
    driver: Option<String>,
    numa: Option<i64>,
    total_vfs: Option<i64>,
    num_vfs: Option<i64>,
    /// PF address, for a VF.
    physfn: Option<String>,
    /// Netdev names under this function (`net/`, `virtio*/net/`), sorted.
    netdevs: Vec<String>,
    /// A PF's `virtfnN` links as (VF address, N), in name order, read with its other facts.
    virtfns: Vec<(String, i64)>,
}

impl PciFn {
    fn kind(&self) -> DeviceKind {
        if self.physfn.is_some() {
            DeviceKind::Vf
        } else if self.total_vfs.unwrap_or(0) > 0 {
            DeviceKind::Pf
        } else {
            DeviceKind::Nic
        }
    }
}

/// A device before the decision: what it is, plus the facts the filter needs.
struct Candidate {
    device: NetDevice,
    /// Reason it can never be offered (loopback, representor), decided during classification.
    never: Option<String>,
    alt_names: Vec<String>,
    pci_ids: Option<(u16, u16)>,
    driver: Option<String>,
}

struct Walk<'a> {
    sysfs: &'a Sysfs,
    sources: &'a Sources,
    names: PciNames,
    netdevs: BTreeMap<String, Netdev>,
    pci: BTreeMap<String, PciFn>,
    /// VF address → its N in the PF's `virtfnN` links, built once per scan: looking it up per
    /// VF would read every sibling's link and make discovery quadratic in the VF count.
    vf_index: BTreeMap<String, i64>,
    /// Facts every VF asks of its PF, found once per PF: a switchdev PF's `net/` holds a
    /// representor per VF, so finding the uplink per VF would be quadratic too.
    pfs: PfFacts,
}

/// Per-PF answers shared by its VFs, filled on first use (by whichever thread gets there).
#[derive(Default)]
struct PfFacts {
    /// The PF's own netdev by the PF's resolved directory.
    netdev: Mutex<HashMap<PathBuf, Option<String>>>,
    /// The MACs of the PF's VF table (`IFLA_VFINFO_LIST`) by PF netdev and VF number.
    vf_macs: Mutex<HashMap<String, Arc<BTreeMap<i64, String>>>>,
}

pub(super) fn run(
    sysfs: &Sysfs,
    sources: &Sources,
    default_route_ifaces: &BTreeSet<String>,
    filter: &Filter,
) -> Inventory {
    let sysfs = &sysfs.memoised();
    let mut walk = Walk {
        sysfs,
        sources,
        names: PciNames::load(sysfs.root()),
        netdevs: BTreeMap::new(),
        pci: BTreeMap::new(),
        vf_index: BTreeMap::new(),
        pfs: PfFacts::default(),
    };
    walk.scan();
    walk.index_vfs();
    let candidates = walk.candidates();
    let route_reasons = walk.route_closure(default_route_ifaces);
    decide(candidates, &route_reasons, filter)
}

impl Walk<'_> {
    /// One candidate per PCI function (or per port netdev of it), per representor, and per
    /// netdev without a PCI function.
    fn candidates(&self) -> Vec<Candidate> {
        let functions: Vec<&PciFn> = self.pci.values().collect();
        let mut out: Vec<Candidate> = par_map(&functions, |f| self.function_candidates(f))
            .into_iter()
            .flatten()
            .collect();
        self.netdev_candidates(&mut out);
        out
    }

    /// The candidates of one PCI function: the function itself or its ports, and its
    /// representors.
    fn function_candidates(&self, function: &PciFn) -> Vec<Candidate> {
        let mut out = Vec::new();
        let kind = function.kind();
        let (reps, ports): (Vec<&Netdev>, Vec<&Netdev>) = function
            .netdevs
            .iter()
            .filter_map(|n| self.netdevs.get(n))
            .partition(|d| d.phys_port_name.as_deref().is_some_and(is_representor_port));
        let Some(base) = pci_device_name(&function.bdf) else {
            tracing::warn!(bdf = %function.bdf, "not a PCI address; skipping function");
            return out;
        };
        if ports.is_empty() {
            out.push(self.pci_candidate(function, kind, base.clone(), None));
        }
        for port in ports {
            let name = if port.dev_port > 0 {
                format!("{base}-p{}", port.dev_port)
            } else {
                base.clone()
            };
            out.push(self.pci_candidate(function, kind, name, Some(port)));
        }
        for rep in reps {
            let mut attrs = Attrs::default();
            attrs.str("kind", DeviceKind::Representor.as_str());
            attrs.str("pciAddress", &function.bdf);
            self.netdev_attrs(rep, &mut attrs);
            out.push(Candidate {
                device: NetDevice {
                    name: netdev_device_name(&rep.name),
                    kind: DeviceKind::Representor,
                    if_name: Some(rep.name.clone()),
                    pci_address: Some(function.bdf.clone()),
                    attributes: attrs.finish(&rep.name),
                },
                never: Some(format!(
                    "switchdev representor (phys_port_name {})",
                    rep.phys_port_name.as_deref().unwrap_or_default()
                )),
                alt_names: alt_names(rep),
                pci_ids: None,
                driver: function.driver.clone(),
            });
        }
        out
    }

    /// One candidate per netdev without a PCI function.
    fn netdev_candidates(&self, out: &mut Vec<Candidate>) {
        for dev in self.netdevs.values().filter(|d| d.pci.is_none()) {
            let kind = if dev.is_loopback {
                DeviceKind::Loopback
            } else if dev.is_virtual {
                DeviceKind::Virtual
            } else {
                DeviceKind::Nic
            };
            let mut attrs = Attrs::default();
            attrs.str("kind", kind.as_str());
            if let Some(driver) = &dev.parent_driver {
                attrs.str("driver", driver);
            }
            if kind == DeviceKind::Virtual
                && let Some(link_kind) = self.link_kind(dev)
            {
                attrs.str("linkKind", &link_kind);
            }
            self.netdev_attrs(dev, &mut attrs);
            out.push(Candidate {
                device: NetDevice {
                    name: netdev_device_name(&dev.name),
                    kind,
                    if_name: Some(dev.name.clone()),
                    pci_address: None,
                    attributes: attrs.finish(&dev.name),
                },
                never: (kind == DeviceKind::Loopback).then(|| "loopback".to_owned()),
                alt_names: alt_names(dev),
                pci_ids: None,
                driver: dev.parent_driver.clone(),
            });
        }
    }

    fn pci_candidate(
        &self,
        function: &PciFn,
        kind: DeviceKind,
        name: String,
        port: Option<&Netdev>,
    ) -> Candidate {
        let s = self.sysfs;
        let mut attrs = Attrs::default();
        attrs.str("kind", kind.as_str());
        attrs.str("pciAddress", &function.bdf);
        attrs.str(ATTR_PCI_BUS_ID, &function.bdf);
        if let Some(root) = pcie_root(&function.real) {
            attrs.str(ATTR_PCIE_ROOT, &root);
        }
        if let Some(vendor) = function.vendor {
            attrs.str("pciVendor", &format!("{vendor:04x}"));
            if let Some(name) = self.names.vendor(vendor) {
                attrs.str("vendorName", &name);
            }
            if let Some(device) = function.device
                && let Some(name) = self.names.device(vendor, device)
            {
                attrs.str("deviceName", &name);
            }
        }
        if let Some(device) = function.device {
            attrs.str("pciDevice", &format!("{device:04x}"));
        }
        if let (Some(sv), Some(sd)) = (function.sub_vendor, function.sub_device) {
            attrs.str("pciSubsystem", &format!("{sv:04x}:{sd:04x}"));
        }
        if let Some(driver) = &function.driver {
            attrs.str("driver", driver);
        }
        if let Some(numa) = function.numa {
            attrs.int("numaNode", numa);
        }
        attrs.bool("sriov", kind == DeviceKind::Pf);
        if kind == DeviceKind::Pf {
            if let Some(total) = function.total_vfs {
                attrs.int("sriovTotalVfs", total);
            }
            if let Some(num) = function.num_vfs {
                attrs.int("sriovNumVfs", num);
            }
            if let Some(mode) = self.sources.devlink.eswitch_mode(&function.bdf) {
                attrs.str("eswitchMode", mode.as_str());
            }
        }
        if let Some(pf_bdf) = &function.physfn {
            attrs.str("pfPciAddress", pf_bdf);
            // The PF's mode, so a claim can ask for VFs of switchdev PFs (offloads) or legacy
            // ones; devlink answers per PF only.
            if let Some(mode) = self.sources.devlink.eswitch_mode(pf_bdf) {
                attrs.str("eswitchMode", mode.as_str());
            }
            let pf_real = function.real.join("physfn");
            let pf_name = self.pf_netdev(&pf_real);
            if let Some(pf_name) = &pf_name {
                attrs.str("pfName", pf_name);
            }
            let index = self.vf_index.get(&function.bdf).copied();
            if let Some(index) = index {
                attrs.int("vfIndex", index);
            }
            // Without a netdev, the PF's VF table is the only place the VF's MAC shows.
            if let (None, Some(index), Some(pf_name)) = (port, index, &pf_name)
                && let Some(mac) = self.vf_macs(pf_name).get(&index)
            {
                attrs.str("mac", mac);
            }
        }
        let ib = s.list(&function.real.join("infiniband"));
        attrs.bool("rdma", !ib.is_empty());
        if let Some(first) = ib.first() {
            attrs.str("rdmaDevice", first);
        }
        if let Some(port) = port {
            self.netdev_attrs(port, &mut attrs);
        }
        Candidate {
            device: NetDevice {
                name,
                kind,
                if_name: port.map(|p| p.name.clone()),
                pci_address: Some(function.bdf.clone()),
                attributes: attrs.finish(port.map_or(function.bdf.as_str(), |p| p.name.as_str())),
            },
            never: None,
            alt_names: port.map(alt_names).unwrap_or_default(),
            pci_ids: function.vendor.zip(function.device),
            driver: function.driver.clone(),
        }
    }

    /// The MACs a PF's VF table sets (zero MACs left out), by VF number; the first entry of a
    /// number counts, as a search of the table would find it.
    fn vf_macs(&self, pf_name: &str) -> Arc<BTreeMap<i64, String>> {
        let cache = || lock(&self.pfs.vf_macs);
        if let Some(known) = cache().get(pf_name) {
            return known.clone();
        }
        let mut macs = BTreeMap::new();
        for vf in self
            .sources
            .links
            .link(pf_name)
            .into_iter()
            .flat_map(|l| l.vfs)
        {
            if let std::collections::btree_map::Entry::Vacant(slot) =
                macs.entry(i64::from(vf.index))
            {
                // A VF listed twice: the first entry answers, even when it has no MAC.
                slot.insert(vf.mac);
            }
        }
        let macs: BTreeMap<i64, String> = macs
            .into_iter()
            .filter_map(|(i, mac)| Some((i, mac.filter(|m| !is_zero_mac(m))?)))
            .collect();
        cache()
            .entry(pf_name.to_owned())
            .or_insert_with(|| Arc::new(macs))
            .clone()
    }

    /// [`Walk::uncached_pf_netdev`] once per PF (by its resolved directory).
    fn pf_netdev(&self, pf_link: &Path) -> Option<String> {
        let pf_real = self.sysfs.resolve(pf_link);
        if let Some(known) = lock(&self.pfs.netdev).get(&pf_real) {
            return known.clone();
        }
        let found = self.uncached_pf_netdev(&pf_real);
        lock(&self.pfs.netdev)
            .entry(pf_real)
            .or_insert(found)
            .clone()
    }

    /// The PF's own netdev: the only one under `physfn/net/`, or among several (switchdev
    /// uplink plus representors) the uplink, whose `phys_port_name` is `p<N>`.
    fn uncached_pf_netdev(&self, pf_real: &Path) -> Option<String> {
        let dir = pf_real.join("net");
        let names = self.sysfs.list(&dir);
        if names.len() <= 1 {
            return names.into_iter().next();
        }
        names.into_iter().find(|n| {
            self.sysfs
                .read(&dir.join(n).join("phys_port_name"))
                .is_some_and(|p| is_uplink_port(&p))
        })
    }

    fn netdev_attrs(&self, dev: &Netdev, attrs: &mut Attrs) {
        let facts = &dev.facts;
        attrs.str("ifName", &dev.name);
        if let Some(mac) = facts.address.as_deref().filter(|m| !is_zero_mac(m)) {
            attrs.str("mac", mac);
        }
        if let Some(mtu) = facts.mtu.filter(|m| *m > 0) {
            attrs.int("mtu", mtu);
        }
        let state = facts
            .operstate
            .as_deref()
            .or_else(|| dev.link.as_ref().and_then(|l| l.oper_state.as_deref()))
            .filter(|st| *st != "unknown");
        if let Some(state) = state {
            attrs.str("state", state);
        }
        // An interface nobody set up reads `down` whatever its cable: said apart (only then, so
        // the usual attribute set stays as it is), so it is not taken for a broken link.
        if facts.flags.is_some_and(|f| f & IFF_UP == 0) {
            attrs.bool("adminDown", true);
        }
        if let Some(speed) = facts.speed.filter(|v| *v > 0) {
            attrs.int("speed", speed);
        }
        if let Some(features) = self.sources.ethtool.active_features(&dev.name) {
            attrs.bool("vlanCapable", !features.contains("vlan-challenged"));
        }
    }

    /// The software kind: netlink's IFLA_INFO_KIND, else uevent DEVTYPE, else the per-kind
    /// sysfs directories.
    fn link_kind(&self, dev: &Netdev) -> Option<String> {
        if let Some(kind) = dev.link.as_ref().and_then(|l| l.kind.clone()) {
            return Some(kind);
        }
        if let Some(devtype) = self.sysfs.read(&dev.real.join("uevent")).and_then(|u| {
            u.lines()
                .find_map(|l| l.strip_prefix("DEVTYPE=").map(str::to_owned))
        }) {
            return Some(devtype);
        }
        if self.sysfs.is_dir(&dev.real.join("bonding")) {
            return Some("bond".to_owned());
        }
        if self.sysfs.is_dir(&dev.real.join("bridge")) {
            return Some("bridge".to_owned());
        }
        None
    }

    fn is_aggregate(&self, dev: &Netdev) -> bool {
        self.link_kind(dev)
            .is_some_and(|k| matches!(k.as_str(), "bond" | "bridge" | "team"))
    }

    /// The interfaces that must stay with the node because a default route depends on them:
    /// the route interfaces, their bond/bridge masters, and (transitively) the slaves, ports and
    /// lower devices of those. Maps interface name to the reason. A route interface need not be
    /// visible itself (a capture may lack the bridge): its ports still point at it.
    fn route_closure(&self, routes: &BTreeSet<String>) -> BTreeMap<String, String> {
        // Each netdev's masters take a listing and a link read: in parallel, like the scan.
        let netdevs: Vec<&Netdev> = self.netdevs.values().collect();
        let masters = par_map(&netdevs, |d| self.masters(d));
        let master_of: BTreeMap<&str, BTreeSet<String>> = netdevs
            .iter()
            .map(|d| d.name.as_str())
            .zip(masters)
            .collect();
        let mut reasons: BTreeMap<String, String> = BTreeMap::new();
        let mut work: Vec<(String, String)> = Vec::new();
        for name in routes {
            reasons.insert(name.clone(), "carries a node default route".to_owned());
            work.push((name.clone(), name.clone()));
        }
        while let Some((name, root)) = work.pop() {
            let mut related: Vec<(String, &str)> = Vec::new();
            if let Some(dev) = self.netdevs.get(&name) {
                for master in master_of.get(dev.name.as_str()).into_iter().flatten() {
                    related.push((master.clone(), "bond/bridge master"));
                }
                for lower in self.lowers(dev) {
                    related.push((lower, "slave, port or lower device"));
                }
            }
            for (other, masters) in &master_of {
                if masters.contains(&name) {
                    related.push(((*other).to_owned(), "slave, port or lower device"));
                }
            }
            for (other, relation) in related {
                if reasons.contains_key(&other) {
                    continue;
                }
                reasons.insert(
                    other.clone(),
                    format!("{relation} of {name}, which serves the default route on {root}"),
                );
                work.push((other, root.clone()));
            }
        }
        reasons
    }

    /// `master`, netlink's master, and `upper_*` links that are bonds or bridges.
    fn masters(&self, dev: &Netdev) -> BTreeSet<String> {
        let s = self.sysfs;
        let mut out = BTreeSet::new();
        if let Some(master) = s.link_name(&dev.real.join("master")) {
            out.insert(master);
        }
        if let Some(master) = dev.link.as_ref().and_then(|l| l.master.clone()) {
            out.insert(master);
        }
        for entry in s.list_with_prefix(&dev.real, "upper_") {
            if let Some(upper) = entry.strip_prefix("upper_")
                && self
                    .netdevs
                    .get(upper)
                    .is_some_and(|u| self.is_aggregate(u))
            {
                out.insert(upper.to_owned());
            }
        }
        out
    }

    /// `lower_*` links, bridge ports (`brif/`) and bond slaves (`bonding/slaves`).
    fn lowers(&self, dev: &Netdev) -> BTreeSet<String> {
        let s = self.sysfs;
        let mut out: BTreeSet<String> = s
            .list_with_prefix(&dev.real, "lower_")
            .iter()
            .filter_map(|e| e.strip_prefix("lower_").map(str::to_owned))
            .collect();
        out.extend(s.list(&dev.real.join("brif")));
        if let Some(slaves) = s.read(&dev.real.join("bonding/slaves")) {
            out.extend(slaves.split_whitespace().map(str::to_owned));
        }
        out
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn new_netdev(name: &str, real: PathBuf) -> Netdev {
    Netdev {
        name: name.to_owned(),
        real,
        pci: None,
        is_virtual: false,
        is_loopback: false,
        phys_port_name: None,
        dev_port: 0,
        parent_driver: None,
        link: None,
        facts: NetdevFacts::default(),
    }
}

fn alt_names(dev: &Netdev) -> Vec<String> {
    dev.link
        .as_ref()
        .map(|l| l.alt_names.clone())
        .unwrap_or_default()
}

/// The root complex of a PCI function from its real path: the `pci<domain>:<bus>` directory
/// right below `sys/devices`.
fn pcie_root(real: &Path) -> Option<String> {
    let rest = real.strip_prefix("sys/devices").ok()?;
    let first = rest.components().next()?.as_os_str().to_str()?;
    first.starts_with("pci").then(|| first.to_owned())
}

mod attrs;
mod decide;
mod identity;
mod par;
mod ports;
mod scan;
#[cfg(test)]
mod tests;
