//! The fake kernel's operations, each copying the real kernel's order of effects and its
//! refusals (checked against it by the `kernel_netns` trials).

use knic_proto::netconfig::{ChildKind, Cidr, Route};

use super::super::vf::describe as describe_vf;
use super::super::{NewChild, Session};
use super::*;

impl Session for FakeSession {
    async fn find_link(&mut self, name: &str) -> Result<Option<LinkState>> {
        self.known.remove(name);
        self.lookup(name);
        let mut s = self.kernel.lock();
        Ok(find(&mut s, &self.ns, name).cloned().map(|mut l| {
            l.addresses.clear();
            l
        }))
    }

    async fn addresses(&mut self, index: u32) -> Result<Vec<Cidr>> {
        self.sent(1);
        Ok(self
            .kernel
            .links(&self.ns)
            .into_iter()
            .find(|l| l.index == index)
            .map(|l| l.addresses)
            .unwrap_or_default())
    }

    async fn links(&mut self) -> Result<Vec<LinkState>> {
        self.sent(1);
        self.read("link show")?;
        let mut links = self.kernel.links(&self.ns);
        for l in &mut links {
            l.addresses.clear();
        }
        Ok(links)
    }

    async fn move_link(&mut self, name: &str, to: &Ns, change: &LinkChange) -> Result<Option<u32>> {
        self.lookup(name);
        self.sent(1);
        self.known.remove(name);
        let ns = self.ns.clone();
        let mut s = self.record(format!("link set {name} netns {to} {}", describe(change)))?;
        let Some(pos) = s
            .links
            .get(&ns)
            .and_then(|l| l.iter().position(|l| l.name == name))
        else {
            drop(s);
            return Err(self.missing(name));
        };
        let Some(target) = s.links.get(to) else {
            return Err(Error::kernel(
                to,
                "entering the network namespace",
                "it does not exist",
            ));
        };
        let new_name = change.name.clone().unwrap_or_else(|| name.to_string());
        // Linux (seen on 6.18) moves the device under its current name and only then fails
        // the rename; only a clash of that name too keeps it where it is.
        let renamed_onto_taken = target.iter().any(|l| l.name == new_name);
        let target_has_name = target.iter().any(|l| l.name == name);
        let target_indexes: Vec<u32> = target.iter().map(|l| l.index).collect();
        if renamed_onto_taken && target_has_name {
            return Err(Error::io(
                format!("moving {name}"),
                std::io::Error::other("File exists"),
            ));
        }
        let mut link = s
            .links
            .get_mut(&ns)
            .map(|l| l.remove(pos))
            .ok_or_else(|| self.missing(name))?;
        // The kernel flushes addresses and routes and closes the device on a namespace change.
        link.addresses.clear();
        link.up = false;
        // The device's own MTU range, whatever index it gets.
        let range = s.mtu_range.get(&link.index).copied();
        // Asked to keep its index (`rtnl` does), the kernel refuses the move where the index
        // is taken; `rtnl` then moves it without, and the kernel picks a free one.
        let wanted = change.index.unwrap_or(link.index);
        let kept = if target_indexes.contains(&wanted) {
            s.requests += 2;
            s.next_index += 1;
            link.index = s.next_index;
            None
        } else {
            link.index = wanted;
            Some(wanted)
        };
        // Its name taken in the target, it moves under the requested one (the kernel's `pat`).
        if target_has_name {
            link.name.clone_from(&new_name);
        }
        // The rest is applied in the target: a refusal leaves the device there, half-set.
        let mac_allowed = vf_mac_change(&mut s, &link, change);
        let applied = apply(&mut link, change, range, renamed_onto_taken, mac_allowed);
        link::carry_sizes(
            &mut s,
            (ns.clone(), name.to_owned()),
            (to.clone(), link.name.clone()),
        );
        if applied.is_ok() {
            // Applied last, to the device as the pod now has it.
            set_ipv4_conf(&mut s, to, &link.name, change);
            link::apply_sizes(&mut s, to, &link.name, &change.sizes);
        }
        if let Some(routes) = s.routes.get_mut(&ns) {
            routes.retain(|(ifname, _)| ifname != name);
        }
        // Leaving the namespace unlinks it from its VRF.
        super::routing::forget(&mut s, &ns, name);
        // The kernel flushes a device's neighbor entries when it leaves a namespace.
        s.neighbors.remove(&(ns.clone(), name.to_owned()));
        // The kernel shuts a device's qdiscs down when it changes namespace.
        s.qdiscs.remove(&(ns, name.to_owned()));
        s.links.entry(to.clone()).or_default().push(link);
        applied
            .map(|()| kept)
            .map_err(|refused| Error::io(format!("moving {name}"), refusal(refused)))
    }

    fn remember(&mut self, name: &str, _index: u32) {
        self.known.insert(name.to_owned());
    }

    async fn set_link(&mut self, name: &str, change: &LinkChange) -> Result<()> {
        self.lookup(name);
        self.sent(1);
        if let Some(new) = &change.name {
            self.known.remove(name);
            self.known.insert(new.clone());
        }
        let ns = self.ns.clone();
        let mut s = self.record(format!("link set {name} {}", describe(change)))?;
        let clash = change
            .name
            .as_ref()
            .is_some_and(|n| n != name && find(&mut s, &ns, n).is_some());
        let range = find(&mut s, &ns, name)
            .map(|l| l.index)
            .and_then(|i| s.mtu_range.get(&i).copied());
        let before = find(&mut s, &ns, name).cloned();
        let mac_allowed = before
            .as_ref()
            .is_none_or(|link| vf_mac_change(&mut s, link, change));
        let opened = before.as_ref().is_some_and(|l| !l.up) && change.up == Some(true);
        let mut reset = before.clone();
        if let Some(link) = reset.as_mut().filter(|_| opened) {
            vf_opened(&s, link);
        }
        match find(&mut s, &ns, name) {
            Some(link) => {
                apply(link, change, range, clash, mac_allowed).map_err(|refused| {
                    Error::io(format!("changing link {name}"), refusal(refused))
                })?;
                if let Some(reset) = reset.filter(|_| opened) {
                    link.mac = reset.mac;
                    link.permanent_mac = reset.permanent_mac;
                }
                let now = link.name.clone();
                set_ipv4_conf(&mut s, &ns, &now, change);
                // So do its sizes, and its neighbor entries.
                if let Some(new) = &change.name {
                    link::carry_sizes(
                        &mut s,
                        (ns.clone(), name.to_owned()),
                        (ns.clone(), new.clone()),
                    );
                }
                link::apply_sizes(&mut s, &ns, &now, &change.sizes);
                if let Some(new) = &change.name
                    && let Some(entries) = s.neighbors.remove(&(ns.clone(), name.to_owned()))
                {
                    s.neighbors.insert((ns.clone(), new.clone()), entries);
                }
                // A qdisc belongs to the device, whatever it is called.
                if let Some(new) = &change.name
                    && let Some(tbf) = s.qdiscs.remove(&(ns.clone(), name.to_owned()))
                {
                    s.qdiscs.insert((ns, new.clone()), tbf);
                }
                Ok(())
            }
            None => {
                drop(s);
                Err(self.missing(name))
            }
        }
    }

    async fn add_addresses(&mut self, name: &str, addresses: &[Cidr]) -> Result<()> {
        if addresses.is_empty() {
            return Ok(());
        }
        self.lookup(name);
        self.sent(addresses.len());
        for address in addresses {
            self.add_address(name, *address)?;
        }
        Ok(())
    }

    async fn add_routes(&mut self, name: &str, routes: &[Route]) -> Result<()> {
        if routes.is_empty() {
            return Ok(());
        }
        self.lookup(name);
        self.sent(routes.len());
        for route in routes {
            self.add_route(name, route)?;
        }
        Ok(())
    }

    async fn del_routes(&mut self, name: &str, routes: &[Route]) -> Result<()> {
        if routes.is_empty() {
            return Ok(());
        }
        self.lookup(name);
        self.sent(routes.len());
        for route in routes {
            self.del_route(name, route)?;
        }
        Ok(())
    }

    async fn set_sysctls(
        &mut self,
        name: &str,
        sysctls: &std::collections::BTreeMap<String, String>,
    ) -> Result<()> {
        let ns = self.ns.clone();
        let pairs: Vec<String> = sysctls.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut s = self.record(format!("sysctl {name} {}", pairs.join(" ")))?;
        for (k, v) in sysctls {
            s.sysctls
                .insert((ns.clone(), name.into(), k.clone()), v.clone());
        }
        Ok(())
    }

    async fn offload_sizes(
        &mut self,
        name: &str,
    ) -> Result<Option<knic_proto::netconfig::OffloadSizes>> {
        self.offload_sizes_now(name)
    }

    async fn set_neighbors(
        &mut self,
        name: &str,
        neighbors: &[knic_proto::netconfig::Neighbor],
    ) -> Result<()> {
        self.set_neighbors_now(name, neighbors)
    }

    async fn add_child(
        &mut self,
        parent: &str,
        child: NewChild<'_>,
        to: &Ns,
        change: &LinkChange,
    ) -> Result<()> {
        self.lookup(parent);
        self.sent(1);
        let ns = self.ns.clone();
        let kind = child.kind();
        let spec = match child {
            NewChild::Vlan(id) => format!("type vlan id {id}"),
            NewChild::Of(ChildKind::Macvlan(mode) | ChildKind::Ipvlan(mode)) => {
                format!("type {kind} mode {mode}")
            }
        };
        let mut s = self.record(format!(
            "link add link {parent} {spec} netns {to} {}",
            describe(change)
        ))?;
        let Some(p) = find(&mut s, &ns, parent).cloned() else {
            drop(s);
            return Err(self.missing(parent));
        };
        let Some(target) = s.links.get(to) else {
            return Err(Error::kernel(
                to,
                "entering the network namespace",
                "it does not exist",
            ));
        };
        let name = change.name.clone().unwrap_or_else(|| parent.to_owned());
        if target.iter().any(|l| l.name == name) {
            return Err(Error::io(
                format!("creating a {kind} child of {parent}"),
                std::io::Error::other("File exists"),
            ));
        }
        s.next_index += 1;
        let index = s.next_index;
        let mut link = LinkState {
            index,
            name,
            mtu: p.mtu,
            // A macvlan gets a MAC of its own; VLAN and ipvlan children share their parent's.
            mac: match child {
                NewChild::Of(ChildKind::Macvlan(_)) => Some([0x02, 0, 0, 0, 0xee, index as u8]),
                _ => p.mac,
            },
            up: false,
            addresses: vec![],
            kind: Some(kind.into()),
            permanent_mac: None,
            pci_address: None,
        };
        // A creation with a refused attribute creates nothing.
        apply(&mut link, change, None, false, true).map_err(|refused| {
            Error::io(
                format!("creating {}", link.name),
                std::io::Error::other(refused),
            )
        })?;
        s.sizes.remove(&(to.clone(), link.name.clone()));
        link::apply_sizes(&mut s, to, &link.name, &change.sizes);
        s.lower
            .push(((to.clone(), link.name.clone()), (ns, parent.to_owned())));
        s.links.entry(to.clone()).or_default().push(link);
        Ok(())
    }

    async fn vf_state(&mut self, pf: &str, index: u32) -> Result<Option<VfState>> {
        self.lookup(pf);
        self.sent(1);
        let ns = self.ns.clone();
        let mut s = self.kernel.lock();
        if find(&mut s, &ns, pf).is_none() {
            drop(s);
            return Err(self.missing(pf));
        }
        Ok(s.vfs.get(&(pf.to_owned(), index)).cloned())
    }

    async fn set_vf(&mut self, pf: &str, index: u32, state: &VfState) -> Result<()> {
        self.lookup(pf);
        let ns = self.ns.clone();
        // One request per setting, in the kernel's order, as `rtnl` sends them.
        for (field, one) in super::super::vf::settings(state) {
            self.sent(1);
            let mut s = self.record(format!("link set {pf} vf {index} {}", describe_vf(&one)))?;
            if find(&mut s, &ns, pf).is_none() {
                drop(s);
                return Err(self.missing(pf));
            }
            let key = (pf.to_owned(), index);
            let refused = s
                .vf_refusals
                .get(&(pf.to_owned(), field.to_owned()))
                .copied();
            let enforcing = s.enforcing.contains(pf);
            let Some(vf) = s.vfs.get_mut(&key) else {
                return Err(Error::io(
                    format!("setting VF {index} of {pf}"),
                    std::io::Error::from_raw_os_error(nix::libc::EINVAL),
                ));
            };
            if let Some(errno) = refused {
                return Err(Error::kernel(
                    Ns::Host,
                    format!(
                        "setting VF {index} of {pf}: {field} ({})",
                        describe_vf(&one)
                    ),
                    format!(
                        "{}: {}",
                        super::super::vf::refusal(field, errno),
                        std::io::Error::from_raw_os_error(errno)
                    ),
                ));
            }
            let VfState {
                mac,
                vlan,
                rate,
                spoof_chk,
                trust,
                link_state,
            } = one;
            vf.mac = mac.or(vf.mac);
            vf.vlan = vlan.or(vf.vlan);
            vf.rate = rate.or(vf.rate);
            vf.spoof_chk = spoof_chk.or(vf.spoof_chk);
            vf.link_state = link_state.or(vf.link_state);
            vf.trust = trust.or(vf.trust);
            // igb: a MAC assigns (and is enforced), all zeros clears the assignment.
            if let (Some(mac), true) = (mac, enforcing) {
                if mac == [0; 6] {
                    s.assigned_macs.remove(&key);
                } else {
                    s.assigned_macs.insert(key);
                }
            }
        }
        Ok(())
    }

    async fn set_egress_limit(&mut self, name: &str, tbf: &Tbf) -> Result<()> {
        self.lookup(name);
        self.sent(1);
        let ns = self.ns.clone();
        let mut s = self.record(format!(
            "qdisc replace dev {name} root tbf rate {}bit burst {}b limit {}b",
            tbf.rate.saturating_mul(8),
            tbf.burst,
            tbf.limit
        ))?;
        if find(&mut s, &ns, name).is_none() {
            drop(s);
            return Err(self.missing(name));
        }
        s.qdiscs.insert((ns, name.to_owned()), *tbf);
        Ok(())
    }

    async fn clear_egress_limit(&mut self, name: &str) -> Result<()> {
        self.lookup(name);
        self.sent(1);
        let ns = self.ns.clone();
        let mut s = self.record(format!("qdisc del dev {name} root tbf"))?;
        if find(&mut s, &ns, name).is_none() {
            drop(s);
            return Err(self.missing(name));
        }
        s.qdiscs.remove(&(ns, name.to_owned()));
        Ok(())
    }

    async fn ethtool_state(
        &mut self,
        name: &str,
        asked: &knic_proto::netconfig::EthtoolSettings,
    ) -> Result<super::super::ethtool::EthtoolState> {
        self.ethtool_state_now(name, asked)
    }

    async fn set_ethtool(
        &mut self,
        name: &str,
        settings: &knic_proto::netconfig::EthtoolSettings,
    ) -> Result<()> {
        self.set_ethtool_now(name, settings)
    }

    async fn ensure_segment(&mut self, segment: &super::super::overlay::Segment) -> Result<()> {
        self.ensure_segment_now(segment)
    }

    async fn add_veth(
        &mut self,
        host: &str,
        bridge: &str,
        to: &Ns,
        mtu: u32,
        change: &LinkChange,
    ) -> Result<()> {
        self.add_veth_now(host, bridge, to, mtu, change)
    }

    async fn fdb(&mut self, vxlan: &str) -> Result<Vec<super::super::overlay::FdbEntry>> {
        self.fdb_now(vxlan)
    }

    async fn set_fdb(
        &mut self,
        vxlan: &str,
        add: &[super::super::overlay::FdbEntry],
        remove: &[super::super::overlay::FdbEntry],
    ) -> Result<()> {
        self.set_fdb_now(vxlan, add, remove)
    }

    async fn del_link(&mut self, name: &str) -> Result<()> {
        // rtnl looks the name up unless it knows it, and sends the delete only when found.
        let present = find(&mut self.kernel.lock(), &self.ns.clone(), name).is_some();
        let lookups = usize::from(!self.known.contains(name));
        self.sent(lookups + usize::from(present));
        self.known.remove(name);
        let mut s = self.record(format!("link del {name}"))?;
        let mut doomed = vec![(self.ns.clone(), name.to_owned())];
        while let Some((ns, name)) = doomed.pop() {
            s.qdiscs.remove(&(ns.clone(), name.clone()));
            s.neighbors.remove(&(ns.clone(), name.clone()));
            s.sizes.remove(&(ns.clone(), name.clone()));
            s.vxlans.remove(&(ns.clone(), name.clone()));
            super::routing::forget(&mut s, &ns, &name);
            if let Some(links) = s.links.get_mut(&ns) {
                links.retain(|l| l.name != name);
            }
            if let Some(routes) = s.routes.get_mut(&ns) {
                routes.retain(|(ifname, _)| *ifname != name);
            }
            let key = (ns, name);
            doomed.extend(
                s.lower
                    .iter()
                    .filter(|(_, lower)| *lower == key)
                    .map(|(child, _)| child.clone()),
            );
            s.lower
                .retain(|(child, lower)| *child != key && *lower != key);
        }
        Ok(())
    }

    async fn add_rules(&mut self, rules: &[super::super::routing::Rule]) -> Result<()> {
        self.add_rules_now(rules)
    }

    async fn del_rules(&mut self, rules: &[super::super::routing::Rule]) -> Result<()> {
        self.del_rules_now(rules)
    }

    async fn vrf(&mut self, name: &str) -> Result<Option<super::super::routing::VrfLink>> {
        self.vrf_now(name)
    }

    async fn add_vrf(&mut self, vrf: &super::super::routing::Vrf) -> Result<()> {
        self.add_vrf_now(vrf)
    }

    async fn set_master(&mut self, name: &str, master: &str) -> Result<()> {
        self.set_master_now(name, master)
    }
}

/// A refusal of `apply` as the kernel's errno where knic tells it apart.
fn refusal(text: &'static str) -> std::io::Error {
    match text {
        "Cannot assign requested address" => {
            std::io::Error::from_raw_os_error(nix::libc::EADDRNOTAVAIL)
        }
        other => std::io::Error::other(other),
    }
}
