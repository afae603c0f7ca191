//! The fake kernel's overlay segments: a bridge and a VXLAN device per VNI, veth pairs whose
//! ends die together, and each VXLAN device's forwarding entries, with the real kernel's
//! refusals (another device on the VNI and port; a name of another kind).

use super::super::overlay::{FdbEntry, Segment};
use super::*;

/// What the fake keeps of a VXLAN device beyond its link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Vxlan {
    pub vni: u32,
    pub port: u16,
    pub local: std::net::IpAddr,
    pub fdb: BTreeSet<FdbEntry>,
}

fn new_link(s: &mut State, name: &str, mtu: u32, kind: &str, up: bool) -> LinkState {
    s.next_index += 1;
    let index = s.next_index;
    LinkState {
        index,
        name: name.to_owned(),
        mtu,
        mac: Some([0x02, 0, 0, 0, 0xbb, index as u8]),
        up,
        addresses: vec![],
        kind: Some(kind.into()),
        permanent_mac: None,
        pci_address: None,
    }
}

impl FakeSession {
    pub(super) fn ensure_segment_now(&mut self, segment: &Segment) -> Result<()> {
        self.sent(2);
        let ns = self.ns.clone();
        let (bridge, vxlan) = (segment.bridge.clone(), segment.vxlan.clone());
        let mut s = self.record(format!(
            "segment {} port {} local {} mtu {}",
            segment.vni, segment.port, segment.local, segment.mtu
        ))?;
        let not_ours = |name: &str, what: String| {
            Error::kernel(
                &ns,
                format!("creating VXLAN segment {} as {name}", segment.vni),
                format!("{what}; it is not knic's"),
            )
        };
        match find(&mut s, &ns, &bridge).map(|l| l.kind.clone()) {
            Some(Some(k)) if k == "bridge" => {}
            Some(kind) => {
                let kind = kind.unwrap_or_else(|| "plain".into());
                return Err(not_ours(
                    &bridge,
                    format!("a {kind} link of that name exists"),
                ));
            }
            // Made below, once the VXLAN device is sure to follow: the kernel path deletes a
            // bridge it made when the device is refused, so neither leaves one behind.
            None => {}
        }
        if find(&mut s, &ns, &segment.underlay).is_none() {
            drop(s);
            return Err(self.missing(&segment.underlay));
        }
        let key = (ns.clone(), vxlan.clone());
        if let Some(link) = find(&mut s, &ns, &vxlan).cloned() {
            return match s.vxlans.get(&key) {
                Some(v)
                    if v.vni == segment.vni
                        && v.port == segment.port
                        && v.local == segment.local =>
                {
                    Ok(())
                }
                Some(v) => Err(not_ours(
                    &vxlan,
                    format!(
                        "a vxlan link of that name exists with VNI {} port {} local {}",
                        v.vni, v.port, v.local
                    ),
                )),
                None => Err(not_ours(
                    &vxlan,
                    format!(
                        "a {} link of that name exists",
                        link.kind.unwrap_or_else(|| "plain".into())
                    ),
                )),
            };
        }
        if s.vxlans
            .iter()
            .any(|((n, _), v)| *n == ns && v.vni == segment.vni && v.port == segment.port)
        {
            return Err(Error::kernel(
                &ns,
                format!("creating VXLAN segment {} as {vxlan}", segment.vni),
                format!(
                    "VXLAN port {} VNI {} is used by another link on this node \
                     (the cluster's CNI?): choose another spec.vxlan.port or vni",
                    segment.port, segment.vni
                ),
            ));
        }
        if find(&mut s, &ns, &bridge).is_none() {
            let link = new_link(&mut s, &bridge, segment.mtu, "bridge", true);
            s.links.entry(ns.clone()).or_default().push(link);
        }
        let link = new_link(&mut s, &vxlan, segment.mtu, "vxlan", true);
        s.links.entry(ns.clone()).or_default().push(link);
        s.vxlans.insert(
            key,
            Vxlan {
                vni: segment.vni,
                port: segment.port,
                local: segment.local,
                fdb: BTreeSet::new(),
            },
        );
        Ok(())
    }

    pub(super) fn add_veth_now(
        &mut self,
        host: &str,
        bridge: &str,
        to: &Ns,
        mtu: u32,
        change: &LinkChange,
    ) -> Result<()> {
        self.lookup(bridge);
        self.sent(1);
        let ns = self.ns.clone();
        let mut s = self.record(format!(
            "link add {host} master {bridge} type veth peer netns {to} {}",
            describe(change)
        ))?;
        if find(&mut s, &ns, bridge).is_none() {
            drop(s);
            return Err(self.missing(bridge));
        }
        if !s.links.contains_key(to) {
            return Err(Error::kernel(
                to,
                "entering the network namespace",
                "it does not exist",
            ));
        }
        let pod_name = change.name.clone().unwrap_or_else(|| host.to_owned());
        let taken = find(&mut s, &ns, host).is_some() || find(&mut s, to, &pod_name).is_some();
        if taken {
            return Err(Error::io(
                format!("creating the veth {host} on {bridge} for namespace {to}"),
                std::io::Error::other("File exists"),
            ));
        }
        let host_end = new_link(&mut s, host, mtu, "veth", true);
        let mut pod_end = new_link(&mut s, &pod_name, mtu, "veth", false);
        apply(&mut pod_end, change, None, false, true).map_err(|refused| {
            Error::io(
                format!("creating {}", pod_end.name),
                std::io::Error::other(refused),
            )
        })?;
        let (h, p) = ((ns.clone(), host.to_owned()), (to.clone(), pod_name));
        // Either end's deletion (a pod namespace dying, a detach) takes the other with it.
        s.lower.push((p.clone(), h.clone()));
        s.lower.push((h, p));
        s.links.entry(ns).or_default().push(host_end);
        s.sizes.remove(&(to.clone(), pod_end.name.clone()));
        super::link::apply_sizes(&mut s, to, &pod_end.name, &change.sizes);
        s.links.entry(to.clone()).or_default().push(pod_end);
        Ok(())
    }

    pub(super) fn fdb_now(&mut self, vxlan: &str) -> Result<Vec<FdbEntry>> {
        self.read(&format!("fdb show dev {vxlan}"))?;
        self.sent(1);
        let s = self.kernel.lock();
        Ok(s.vxlans
            .get(&(self.ns.clone(), vxlan.to_owned()))
            .map(|v| v.fdb.iter().copied().collect())
            .unwrap_or_default())
    }

    pub(super) fn set_fdb_now(
        &mut self,
        vxlan: &str,
        add: &[FdbEntry],
        remove: &[FdbEntry],
    ) -> Result<()> {
        if add.is_empty() && remove.is_empty() {
            return Ok(());
        }
        self.lookup(vxlan);
        self.sent(add.len() + remove.len());
        let key = (self.ns.clone(), vxlan.to_owned());
        let mut s = self.record(format!(
            "fdb {vxlan} add [{}] del [{}]",
            add.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            remove
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ))?;
        let Some(v) = s.vxlans.get_mut(&key) else {
            drop(s);
            return Err(self.missing(vxlan));
        };
        for r in remove {
            v.fdb.remove(r);
        }
        for a in add {
            if !a.is_flood() {
                // A MAC has one place: replace moves it.
                v.fdb.retain(|e| e.mac != a.mac);
            }
            v.fdb.insert(*a);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::{Kernel, Session};
    use super::*;

    fn segment(vni: u32, port: u16) -> Segment {
        Segment::new(vni, port, "10.99.0.1".parse().unwrap(), "eth1", 1450)
    }

    /// The same sequence as the real-kernel trial `kernel/overlay_two_nodes_one_segment`,
    /// with the same outcomes.
    #[tokio::test]
    async fn the_fake_segment_behaves_as_the_kernel_trial_found() {
        let k = FakeKernel::new();
        k.add_link(&Ns::Host, "eth1", 1500, [2, 0, 0, 0, 0, 1], None, &[]);
        let pod = Ns::Pod("/run/netns/pod".into());
        k.add_namespace(&pod);
        let mut s = k.open(&Ns::Host).await.unwrap().unwrap();
        s.ensure_segment(&segment(4242, 4789)).await.unwrap();
        s.ensure_segment(&segment(4242, 4789)).await.unwrap();
        let kinds: Vec<_> = k
            .links(&Ns::Host)
            .into_iter()
            .map(|l| (l.name, l.kind.unwrap_or_default()))
            .collect();
        assert!(kinds.contains(&("knb001092".into(), "bridge".into())));
        assert!(kinds.contains(&("knx001092".into(), "vxlan".into())));

        let change = LinkChange {
            name: Some("net1".into()),
            mac: Some([2, 0x4b, 0, 0, 0, 0xa]),
            ..LinkChange::default()
        };
        s.add_veth("knh-a", "knb001092", &pod, 1450, &change)
            .await
            .unwrap();
        let err = s
            .add_veth("knh-a", "knb001092", &pod, 1450, &change)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("creating the veth knh-a on knb001092"),
            "{err}"
        );
        let net1 = k
            .links(&pod)
            .into_iter()
            .find(|l| l.name == "net1")
            .unwrap();
        assert_eq!((net1.mtu, net1.mac, net1.up), (1450, change.mac, false));

        let peer = "10.99.0.2".parse().unwrap();
        let flood = FdbEntry {
            mac: [0; 6],
            dst: peer,
        };
        let b = FdbEntry {
            mac: [2, 0x4b, 0, 0, 0, 0xb],
            dst: peer,
        };
        s.set_fdb("knx001092", &[flood, b], &[]).await.unwrap();
        s.set_fdb("knx001092", &[flood, b], &[]).await.unwrap();
        assert_eq!(s.fdb("knx001092").await.unwrap(), vec![flood, b]);
        let moved = FdbEntry {
            dst: "10.99.0.3".parse().unwrap(),
            ..b
        };
        s.set_fdb("knx001092", &[moved], &[]).await.unwrap();
        assert_eq!(s.fdb("knx001092").await.unwrap(), vec![flood, moved]);
        s.set_fdb("knx001092", &[], &[flood, moved]).await.unwrap();
        s.set_fdb("knx001092", &[], &[flood, moved]).await.unwrap();
        assert!(s.fdb("knx001092").await.unwrap().is_empty());

        // Another device on the VNI and port: refused, and nothing half-made stays.
        let err = s.ensure_segment(&segment(4242, 4789)).await;
        assert!(err.is_ok(), "knic's own segment again: {err:?}");
        let err = s
            .ensure_segment(&segment(4242, 8472))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("a vxlan link of that name exists with VNI 4242 port 4789 local 10.99.0.1; it is not knic's"),
            "{err}"
        );

        // Either end of the veth takes the other with it; the FDB dies with its device.
        s.del_link("knh-a").await.unwrap();
        assert!(k.links(&pod).iter().all(|l| l.name != "net1"));
        s.del_link("knx001092").await.unwrap();
        assert!(s.fdb("knx001092").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_vni_and_port_taken_by_another_device_leave_nothing_behind() {
        let k = FakeKernel::new();
        k.add_link(&Ns::Host, "eth1", 1500, [2, 0, 0, 0, 0, 1], None, &[]);
        let mut s = k.open(&Ns::Host).await.unwrap().unwrap();
        s.ensure_segment(&segment(77, 4789)).await.unwrap();
        // The same VNI and port under other names (as another CNI's device would be).
        s.del_link("knb00004d").await.unwrap();
        {
            let mut st = k.lock();
            let v = st.vxlans.remove(&(Ns::Host, "knx00004d".into())).unwrap();
            st.vxlans.insert((Ns::Host, "flannel.1".into()), v);
            let links = st.links.get_mut(&Ns::Host).unwrap();
            links
                .iter_mut()
                .find(|l| l.name == "knx00004d")
                .unwrap()
                .name = "flannel.1".into();
        }
        let err = s
            .ensure_segment(&segment(77, 4789))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("VXLAN port 4789 VNI 77 is used by another link on this node (the cluster's CNI?): choose another spec.vxlan.port or vni"),
            "{err}"
        );
        let names: Vec<_> = k.links(&Ns::Host).into_iter().map(|l| l.name).collect();
        assert_eq!(names, vec!["eth1", "flannel.1"]);
    }
}
