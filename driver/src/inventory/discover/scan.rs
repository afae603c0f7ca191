//! Finding a pass's netdevs and PCI network functions, each directory opened once and the
//! ones below it opened relative to it.
//!
//! The PCI functions come first, in parallel: a function's task lists its directory through
//! the descriptor it reads the attributes with, opens `net/` and each netdev below relative to
//! it, and classifies those netdevs there. Every listing lands in the pass's memo, so resolving
//! `class/net` afterwards costs one `readlinkat` per name, and no path is walked again from the
//! root. What the pass decides is the same as reading everything by path in any order (the
//! memo answers as the tree stood when each directory was first listed): `class/net`'s answer
//! for a name still wins over a function's, and a netdev classified under a function whose
//! `class/net` entry points elsewhere is classified again from there.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::identity::PciIdentity;
use super::par::par_map;
use super::{ARPHRD_LOOPBACK, IFF_LOOPBACK, MAX_PARENT_WALK, Netdev, NetdevFacts, PciFn, Walk};
use crate::inventory::names::pci_device_name;
use crate::inventory::sysfs::Dir;

/// A classified netdev and the PCI function owning it (address and directory), when found
/// through its `device` link.
type Classified = (Netdev, Option<(String, PathBuf)>);

/// A netdev met below a PCI function: its name, real directory, and its classification when
/// its directory could be opened from the function's.
type FunctionNetdev = (String, PathBuf, Option<Classified>);

impl Walk<'_> {
    /// Finds every netdev (class/net and PCI functions' net/ dirs) and every PCI network
    /// function, and links them.
    pub(super) fn scan(&mut self) {
        let bus_path = Path::new("sys/bus/pci/devices");
        let bus = self.sysfs.dir(bus_path);
        let found = par_map(&bus.names(), |bdf| {
            let real = bus.resolve(bdf).unwrap_or_else(|| bus_path.join(bdf));
            let dir = self.sysfs.dir(&real);
            let identity = PciIdentity::read(&dir);
            identity.class.is_some_and(|c| c >> 16 == 0x02).then(|| {
                let function = self.read_pci(bdf, real, &dir, identity);
                let netdevs = self.function_netdevs(&function, &dir);
                (function, netdevs)
            })
        });
        drop(bus);
        let mut below: HashMap<String, Vec<FunctionNetdev>> = HashMap::new();
        for (function, netdevs) in found.into_iter().flatten() {
            if !self.pci.contains_key(&function.bdf) {
                below.insert(function.bdf.clone(), netdevs);
                self.pci.insert(function.bdf.clone(), function);
            }
        }

        // `class/net` after the functions: their directories are in the memo now.
        let class_net = self.sysfs.dir(Path::new("sys/class/net"));
        let names = class_net.names();
        let resolved = par_map(&names, |name| {
            class_net
                .resolve(name)
                .filter(|real| self.sysfs.is_dir(real))
        });
        drop(class_net);
        for (name, real) in names.into_iter().zip(resolved) {
            if let Some(real) = real {
                self.netdevs
                    .entry(name.clone())
                    .or_insert_with(|| super::new_netdev(&name, real));
            }
        }
        // Then the functions' netdevs, in address order, the first of a name winning.
        let mut ready: HashMap<String, Classified> = HashMap::new();
        for bdf in self.pci.keys() {
            for (name, real, classified) in below.remove(bdf).into_iter().flatten() {
                let dev = self
                    .netdevs
                    .entry(name.clone())
                    .or_insert_with(|| super::new_netdev(&name, real));
                if let Some(classified) = classified
                    && classified.0.real == dev.real
                    && !ready.contains_key(&name)
                {
                    ready.insert(name, classified);
                }
            }
        }

        let names: Vec<String> = self.netdevs.keys().cloned().collect();
        let classified = par_map(&names, |name| {
            if ready.contains_key(name) {
                return None;
            }
            let dev = self.netdevs.get(name)?;
            let dir = self.sysfs.dir(&dev.real);
            Some(self.classify_netdev(name, dev.real.clone(), &dir, None))
        });
        for (name, classified) in names.iter().zip(classified) {
            let Some((dev, parent)) = classified.or_else(|| ready.remove(name)) else {
                continue;
            };
            if let Some((bdf, real)) = parent
                && !self.pci.contains_key(&bdf)
            {
                let dir = self.sysfs.dir(&real);
                let function = self.read_pci(&bdf, real.clone(), &dir, PciIdentity::read(&dir));
                self.pci.insert(bdf, function);
            }
            if let Some(function) = dev.pci.as_ref().and_then(|bdf| self.pci.get_mut(bdf)) {
                function.netdevs.push(dev.name.clone());
                function.netdevs.sort();
            }
            self.netdevs.insert(dev.name.clone(), dev);
        }
    }

    /// The netdevs in the `net/` and `virtio*/net/` directories of `function` (open as
    /// `dir`), each classified through a descriptor opened relative to its `net/` when it is
    /// a real directory there.
    fn function_netdevs(&self, function: &PciFn, dir: &Dir<'_>) -> Vec<FunctionNetdev> {
        let mut subdirs = vec![(PathBuf::from("net"), dir.child("net"))];
        for entry in dir.names_with_prefix("virtio") {
            let net = dir.child(&entry).child("net");
            subdirs.push((Path::new(&entry).join("net"), net));
        }
        let mut out = Vec::new();
        for (sub, net) in subdirs {
            for name in net.names() {
                let real = net
                    .resolve(&name)
                    .unwrap_or_else(|| function.real.join(&sub).join(&name));
                let own = net.child(&name);
                let classified = (own.real() == Some(real.as_path()))
                    .then(|| self.classify_netdev(&name, real.clone(), &own, Some(dir)));
                out.push((name, real, classified));
            }
        }
        out
    }

    /// Fills the VF index from the PFs' `virtfnN` links, read with their other facts.
    pub(super) fn index_vfs(&mut self) {
        for pf in self.pci.values().filter(|f| f.total_vfs.unwrap_or(0) > 0) {
            for (vf, n) in &pf.virtfns {
                self.vf_index.insert(vf.clone(), *n);
            }
        }
    }

    /// The sysfs facts of the PCI function `bdf` at `real`, opened as `dir`.
    pub(super) fn read_pci(
        &self,
        bdf: &str,
        real: PathBuf,
        dir: &Dir<'_>,
        identity: PciIdentity,
    ) -> PciFn {
        let total_vfs = dir.read_i64("sriov_totalvfs");
        let mut virtfns = Vec::new();
        if total_vfs.unwrap_or(0) > 0 {
            for entry in dir.names_with_prefix("virtfn") {
                let Some(n) = entry
                    .strip_prefix("virtfn")
                    .and_then(|n| n.parse::<i64>().ok())
                else {
                    continue;
                };
                if let Some(vf) = dir.link_name(&entry) {
                    virtfns.push((vf, n));
                }
            }
        }
        PciFn {
            bdf: bdf.to_owned(),
            vendor: identity.vendor,
            device: identity.device,
            sub_vendor: identity.sub_vendor,
            sub_device: identity.sub_device,
            driver: dir.link_name("driver"),
            numa: dir.read_i64("numa_node").filter(|n| *n >= 0),
            total_vfs,
            num_vfs: dir.read_i64("sriov_numvfs"),
            physfn: dir.link_name("physfn"),
            netdevs: Vec::new(),
            virtfns,
            real,
        }
    }

    /// The facts of netdev `name` at `real` (open as `dir`), and the PCI function owning it
    /// (address and directory) when that is found through its `device` link; adding the
    /// function to the walk is the caller's, so netdevs can be classified in parallel.
    /// `function` is the directory the netdev was found below, open already: when the
    /// `device` link leads there, its links are read through it.
    fn classify_netdev(
        &self,
        name: &str,
        real: PathBuf,
        dir: &Dir<'_>,
        function: Option<&Dir<'_>>,
    ) -> Classified {
        let s = self.sysfs;
        let mut parent_pci = None;
        let parent = dir.link_target("device");
        let is_virtual = parent.is_none() || real.starts_with("sys/devices/virtual");
        let mut pci = None;
        let mut parent_driver = None;
        if let (false, Some(mut cur)) = (is_virtual, parent) {
            for _ in 0..MAX_PARENT_WALK {
                let open = function.filter(|f| f.real() == Some(cur.as_path()));
                let subsystem = match open {
                    Some(f) => f.link_name("subsystem"),
                    None => s.link_name(&cur.join("subsystem")),
                };
                let base = cur.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                let has_class = || match open {
                    Some(f) => f.exists("class"),
                    None => s.exists(&cur.join("class")),
                };
                let looks_pci = pci_device_name(base).is_some() && has_class();
                if subsystem.as_deref() == Some("pci") || (subsystem.is_none() && looks_pci) {
                    let bdf = base.to_owned();
                    parent_pci = Some((bdf.clone(), cur.clone()));
                    pci = Some(bdf);
                    break;
                }
                if subsystem.as_deref() != Some("virtio") {
                    parent_driver = match open {
                        Some(f) => f.link_name("driver"),
                        None => s.link_name(&cur.join("driver")),
                    };
                    break;
                }
                match cur.parent() {
                    Some(up) => cur = up.to_owned(),
                    None => break,
                }
            }
        }
        let type_ = dir.read_i64("type");
        let flags = dir.read_hex("flags");
        let link = self.sources.links.link(name);
        let dev = Netdev {
            name: name.to_owned(),
            is_virtual,
            is_loopback: type_ == Some(ARPHRD_LOOPBACK)
                || flags.is_some_and(|f| f & IFF_LOOPBACK != 0),
            phys_port_name: dir.read("phys_port_name"),
            dev_port: dir.read_i64("dev_port").unwrap_or(0),
            parent_driver,
            link,
            pci,
            facts: NetdevFacts {
                address: dir.read("address"),
                mtu: dir.read_i64("mtu"),
                operstate: dir.read("operstate"),
                flags,
                speed: dir.read_i64("speed"),
            },
            real,
        };
        (dev, parent_pci)
    }
}
