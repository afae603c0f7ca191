//! An overlay segment through rtnetlink: the bridge and VXLAN device of a VNI, a pod's veth,
//! and the VXLAN device's static forwarding entries (messages in [`crate::netns::overlay`]).

use std::fs::File;
use std::os::fd::AsRawFd;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkMessage,
};
use netlink_packet_route::neighbour::NeighbourMessage;
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::{EEXIST, ENODEV, ENOENT, RtnlSession, change, io, nl};
use crate::error::{Error, Result};
use crate::netns::overlay::{self, FdbEntry, Segment};
use crate::netns::{LinkChange, Ns};

/// `EADDRINUSE`: another VXLAN device already listens on this port and local address with a
/// configuration the new one conflicts with.
const EADDRINUSE: i32 = 98;

impl RtnlSession {
    pub(super) async fn ensure_segment_now(&mut self, segment: &Segment) -> Result<()> {
        let (bridge, vxlan) = (segment.bridge.clone(), segment.vxlan.clone());
        let what = |name: &str| format!("creating VXLAN segment {} as {name}", segment.vni);
        let mut made_bridge = false;
        match self.find(&bridge).await? {
            Some(link) => {
                if let Some(reason) = overlay::foreign_reason(&link, segment, false) {
                    return Err(Error::kernel(
                        self.describe(),
                        what(&bridge),
                        format!("{reason}; it is not knic's"),
                    ));
                }
            }
            None => {
                let request = change(RouteNetlinkMessage::NewLink(overlay::bridge_message(
                    segment,
                )));
                match self.exchange(request) {
                    Ok(_) => made_bridge = true,
                    Err(e) if e.errno() == Some(EEXIST) => {}
                    Err(e) => return Err(nl(what(&bridge))(e)),
                }
            }
        }
        let result = self.ensure_vxlan(segment, &bridge, &vxlan).await;
        if result.is_err() && made_bridge {
            // Nothing half-made is left: a bridge without its VXLAN device carries nothing,
            // and no record would ever name it for deletion.
            let _ = crate::netns::Session::del_link(self, &bridge).await;
        }
        result
    }

    async fn ensure_vxlan(&mut self, segment: &Segment, bridge: &str, vxlan: &str) -> Result<()> {
        let what = |name: &str| format!("creating VXLAN segment {} as {name}", segment.vni);
        let bridge_index = self.index(bridge).await?;
        if let Some(link) = self.find(vxlan).await? {
            return match overlay::foreign_reason(&link, segment, true) {
                None => Ok(()),
                Some(reason) => Err(Error::kernel(
                    self.describe(),
                    what(vxlan),
                    format!("{reason}; it is not knic's"),
                )),
            };
        }
        let underlay = self.index(&segment.underlay).await?;
        let request = change(RouteNetlinkMessage::NewLink(overlay::vxlan_message(
            segment,
            underlay,
            bridge_index,
        )));
        match self.exchange(request) {
            Ok(_) => Ok(()),
            // No link of that name exists (looked up above), so the kernel means another
            // device: the cluster's own CNI (flannel, Calico, Cilium) on this VNI and port.
            Err(e) if matches!(e.errno(), Some(EEXIST | EADDRINUSE)) => Err(Error::kernel(
                self.describe(),
                what(vxlan),
                format!(
                    "VXLAN port {} VNI {} is used by another link on this node \
                     (the cluster's CNI?): choose another spec.vxlan.port or vni",
                    segment.port, segment.vni
                ),
            )),
            Err(e) => Err(nl(what(vxlan))(e)),
        }
    }

    pub(super) async fn add_veth_now(
        &mut self,
        host: &str,
        bridge: &str,
        to: &Ns,
        mtu: u32,
        link: &LinkChange,
    ) -> Result<()> {
        let bridge_index = self.index(bridge).await?;
        let target = match to {
            Ns::Host => self.host_path.clone(),
            Ns::Pod(p) => p.clone(),
        };
        let fd =
            File::open(&target).map_err(io(format!("opening namespace {}", target.display())))?;
        let message = overlay::veth_message(host, bridge_index, fd.as_raw_fd(), mtu, link);
        self.exchange(change(RouteNetlinkMessage::NewLink(message)))
            .map_err(nl(format!(
                "creating the veth {host} on {bridge} for namespace {to}"
            )))?;
        Ok(())
    }

    pub(super) async fn fdb_now(&mut self, vxlan: &str) -> Result<Vec<FdbEntry>> {
        let Some(link) = self.find(vxlan).await? else {
            return Ok(Vec::new());
        };
        let mut get = NeighbourMessage::default();
        get.header.family = AddressFamily::Bridge;
        // The kernel dumps only this device's entries (as `bridge fdb show dev`), not every
        // bridge's table of the node; the filter below stays for kernels that ignore it.
        get.header.ifindex = link.header.index;
        let mut request = NetlinkMessage::from(RouteNetlinkMessage::GetNeighbour(get));
        request.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        self.sent(1);
        let replies = self
            .wire
            .dump(request)
            .map_err(nl(format!("reading the forwarding entries of {vxlan}")))?;
        let neighbours: Vec<NeighbourMessage> = replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewNeighbour(n) => Some(n),
                _ => None,
            })
            .collect();
        Ok(overlay::fdb_entries(&neighbours, link.header.index))
    }

    pub(super) async fn set_fdb_now(
        &mut self,
        vxlan: &str,
        add: &[FdbEntry],
        remove: &[FdbEntry],
    ) -> Result<()> {
        if add.is_empty() && remove.is_empty() {
            return Ok(());
        }
        let index = self.index(vxlan).await?;
        let mut requests = Vec::with_capacity(add.len() + remove.len());
        let mut contexts = Vec::with_capacity(requests.capacity());
        for entry in remove {
            let mut request = NetlinkMessage::from(RouteNetlinkMessage::DelNeighbour(
                overlay::fdb_message(index, entry),
            ));
            request.header.flags = NLM_F_REQUEST | NLM_F_ACK;
            requests.push(request);
            contexts.push((
                false,
                format!("removing forwarding entry {entry} of {vxlan}"),
            ));
        }
        for entry in add {
            let mut request = NetlinkMessage::from(RouteNetlinkMessage::NewNeighbour(
                overlay::fdb_message(index, entry),
            ));
            // The flood list holds one entry per remote node under the one all-zero MAC
            // (append); a pod's MAC has one place, which may have moved (replace).
            let how = if entry.is_flood() {
                NLM_F_APPEND
            } else {
                NLM_F_REPLACE
            };
            request.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | how;
            requests.push(request);
            contexts.push((true, format!("adding forwarding entry {entry} to {vxlan}")));
        }
        self.sent(requests.len() as u64);
        let answers = self
            .wire
            .requests(requests)
            .map_err(io(format!("changing the forwarding entries of {vxlan}")))?;
        for (answer, (adding, context)) in answers.into_iter().zip(contexts) {
            match answer {
                Ok(_) => {}
                Err(r) if adding && r.errno == EEXIST => {}
                Err(r) if !adding && matches!(r.errno, ENOENT | ENODEV) => {}
                Err(r) => return Err(Error::io(context, r.to_io())),
            }
        }
        Ok(())
    }
}
