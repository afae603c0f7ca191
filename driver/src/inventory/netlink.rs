//! The live host facts discovery adds to sysfs: rtnetlink links, ethtool features, devlink
//! e-switch modes, default-route interfaces, and link-change events.
//!
//! Everything is collected up front into a snapshot of plain tables, and discovery reads the
//! tables through the inventory's source traits. So discovery stays a pure function, and a node
//! where netlink is unavailable (no CAP_NET_ADMIN, an old kernel) gets a smaller but correct
//! inventory: every source failure is logged and treated as "unknown".

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use futures::{Stream, StreamExt, TryStreamExt};
use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload, Nla,
    NlaBuffer, NlasIterator, Parseable, ParseableParametrized, parse_string, parse_u16,
};
use netlink_packet_generic::{GenlFamily, GenlHeader, GenlMessage};
use netlink_packet_route::AddressFamily;
use netlink_packet_route::link::{
    LinkAttribute, LinkExtentMask, LinkInfo as RtLinkInfo, Prop, VfInfo,
};

use crate::inventory::sources::{
    EswitchMode, FakeDevlink, FakeEthtool, FakeLinks, LinkInfo, Sources, VfInfo as InvVfInfo,
};

/// Everything netlink told us at one instant.
#[derive(Debug, Clone, Default)]
pub struct HostSnapshot {
    /// rtnetlink facts by interface name.
    pub links: BTreeMap<String, LinkInfo>,
    /// Active ethtool features by interface name.
    pub features: BTreeMap<String, BTreeSet<String>>,
    /// E-switch mode by PCI address.
    pub eswitch: BTreeMap<String, EswitchMode>,
}

impl HostSnapshot {
    /// The inventory's sources, filled from this snapshot (the table-driven implementations
    /// serve both tests and production; only where the tables come from differs).
    pub fn into_sources(self) -> Sources {
        Sources {
            links: Box::new(FakeLinks { links: self.links }),
            ethtool: Box::new(FakeEthtool {
                active: self.features,
            }),
            devlink: Box::new(FakeDevlink {
                modes: self.eswitch,
            }),
        }
    }
}

/// Reads links, features and e-switch modes from the kernel of the current network namespace.
/// Never fails: a source that cannot be read contributes nothing, with a log line.
pub async fn snapshot() -> HostSnapshot {
    let links = match links().await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "rtnetlink link dump failed; link kinds and masters unknown");
            BTreeMap::new()
        }
    };
    let features = match features().await {
        Ok(f) => f,
        Err(e) => {
            tracing::debug!(error = %e, "ethtool feature dump failed; VLAN capability unknown");
            BTreeMap::new()
        }
    };
    let eswitch = match eswitch_modes().await {
        Ok(m) => m,
        Err(e) => {
            tracing::debug!(error = %e, "devlink query failed; e-switch modes unknown");
            BTreeMap::new()
        }
    };
    HostSnapshot {
        links,
        features,
        eswitch,
    }
}

fn mac_string(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

async fn links() -> std::io::Result<BTreeMap<String, LinkInfo>> {
    let (connection, handle, _) = rtnetlink::new_connection()?;
    let task = tokio::spawn(connection);
    // RTEXT_FILTER_VF: include each PF's VF table (the only place a netdev-less VF's MAC shows).
    let mut dump = handle
        .link()
        .get()
        .set_filter_mask(AddressFamily::Unspec, vec![LinkExtentMask::Vf])
        .execute();
    let mut by_index: BTreeMap<u32, (String, LinkInfo)> = BTreeMap::new();
    while let Some(msg) = dump.try_next().await.map_err(std::io::Error::other)? {
        let mut name = None;
        let mut info = LinkInfo::default();
        for attr in msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => name = Some(n),
                LinkAttribute::LinkInfo(infos) => {
                    for i in infos {
                        if let RtLinkInfo::Kind(kind) = i {
                            info.kind = Some(kind.to_string());
                        }
                    }
                }
                LinkAttribute::Controller(index) => info.master_ifindex = Some(index),
                LinkAttribute::PropList(props) => {
                    for p in props {
                        if let Prop::AltIfName(alt) = p {
                            info.alt_names.push(alt);
                        }
                    }
                }
                LinkAttribute::OperState(state) => {
                    info.oper_state = Some(state.to_string().to_ascii_lowercase());
                }
                LinkAttribute::VfInfoList(vfs) => {
                    for vf in vfs {
                        let mut entry = InvVfInfo::default();
                        for item in vf.0 {
                            match item {
                                VfInfo::Mac(m) => {
                                    entry.index = m.vf_id;
                                    let mac = &m.mac[..6];
                                    if mac.iter().any(|b| *b != 0) {
                                        entry.mac = Some(mac_string(mac));
                                    }
                                }
                                VfInfo::Vlan(v) => {
                                    entry.vlan = u16::try_from(v.vlan_id).ok().filter(|v| *v != 0);
                                }
                                _ => {}
                            }
                        }
                        info.vfs.push(entry);
                    }
                }
                _ => {}
            }
        }
        if let Some(name) = name {
            by_index.insert(msg.header.index, (name, info));
        }
    }
    task.abort();
    let names: BTreeMap<u32, String> = by_index.iter().map(|(i, (n, _))| (*i, n.clone())).collect();
    Ok(by_index
        .into_values()
        .map(|(name, mut info)| {
            info.master = info.master_ifindex.and_then(|i| names.get(&i).cloned());
            (name, info)
        })
        .collect())
}

async fn features() -> std::io::Result<BTreeMap<String, BTreeSet<String>>> {
    use ethtool::{EthtoolAttr, EthtoolFeatureAttr, EthtoolHeader};
    let (connection, mut handle, _) = ethtool::new_connection()?;
    let task = tokio::spawn(connection);
    let mut dump = std::pin::pin!(
        handle
            .feature()
            .get(None)
            .execute()
            .await
            .map_err(std::io::Error::other)?
    );
    let mut out = BTreeMap::new();
    while let Some(msg) = dump.next().await {
        let msg = msg.map_err(std::io::Error::other)?;
        let mut name = None;
        let mut active = BTreeSet::new();
        for attr in msg.payload.nlas {
            match attr {
                EthtoolAttr::Feature(EthtoolFeatureAttr::Header(headers)) => {
                    for h in headers {
                        if let EthtoolHeader::DevName(n) = h {
                            name = Some(n);
                        }
                    }
                }
                EthtoolAttr::Feature(EthtoolFeatureAttr::Active(bits)) => {
                    active.extend(bits.into_iter().filter(|b| b.value).map(|b| b.name));
                }
                _ => {}
            }
        }
        if let Some(name) = name {
            out.insert(name, active);
        }
    }
    task.abort();
    Ok(out)
}

// devlink generic netlink constants (include/uapi/linux/devlink.h).
const DEVLINK_CMD_GET: u8 = 1;
const DEVLINK_CMD_ESWITCH_GET: u8 = 29;
const DEVLINK_ATTR_BUS_NAME: u16 = 1;
const DEVLINK_ATTR_DEV_NAME: u16 = 2;
const DEVLINK_ATTR_ESWITCH_MODE: u16 = 25;

/// A devlink generic netlink message: just the command and the attributes knic uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevlinkMessage {
    /// DEVLINK_CMD_*.
    pub cmd: u8,
    /// Attributes.
    pub attrs: Vec<DevlinkAttr>,
}

/// The devlink attributes knic reads or writes; the rest are kept opaque.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DevlinkAttr {
    /// DEVLINK_ATTR_BUS_NAME, e.g. `pci`.
    BusName(String),
    /// DEVLINK_ATTR_DEV_NAME, e.g. `0000:3b:00.0`.
    DevName(String),
    /// DEVLINK_ATTR_ESWITCH_MODE: 0 legacy, 1 switchdev.
    EswitchMode(u16),
    /// Anything else.
    Other(DefaultNla),
}

impl Nla for DevlinkAttr {
    fn value_len(&self) -> usize {
        match self {
            DevlinkAttr::BusName(s) | DevlinkAttr::DevName(s) => s.len() + 1,
            DevlinkAttr::EswitchMode(_) => 2,
            DevlinkAttr::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            DevlinkAttr::BusName(_) => DEVLINK_ATTR_BUS_NAME,
            DevlinkAttr::DevName(_) => DEVLINK_ATTR_DEV_NAME,
            DevlinkAttr::EswitchMode(_) => DEVLINK_ATTR_ESWITCH_MODE,
            DevlinkAttr::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            // NUL-terminated strings, as the kernel's NLA_NUL_STRING policy expects.
            DevlinkAttr::BusName(s) | DevlinkAttr::DevName(s) => {
                buffer[..s.len()].copy_from_slice(s.as_bytes());
                buffer[s.len()] = 0;
            }
            DevlinkAttr::EswitchMode(m) => buffer[..2].copy_from_slice(&m.to_ne_bytes()),
            DevlinkAttr::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for DevlinkAttr {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
        let payload = buf.value();
        Ok(match buf.kind() {
            DEVLINK_ATTR_BUS_NAME => DevlinkAttr::BusName(parse_string(payload)?),
            DEVLINK_ATTR_DEV_NAME => DevlinkAttr::DevName(parse_string(payload)?),
            DEVLINK_ATTR_ESWITCH_MODE => DevlinkAttr::EswitchMode(parse_u16(payload)?),
            _ => DevlinkAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

impl GenlFamily for DevlinkMessage {
    fn family_name() -> &'static str {
        "devlink"
    }
    fn command(&self) -> u8 {
        self.cmd
    }
    fn version(&self) -> u8 {
        1
    }
}

impl Emitable for DevlinkMessage {
    fn buffer_len(&self) -> usize {
        self.attrs.as_slice().buffer_len()
    }
    fn emit(&self, buffer: &mut [u8]) {
        self.attrs.as_slice().emit(buffer)
    }
}

impl ParseableParametrized<[u8], GenlHeader> for DevlinkMessage {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        let attrs = NlasIterator::new(buf)
            .map(|nla| nla.and_then(|nla| DevlinkAttr::parse(&nla)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DevlinkMessage {
            cmd: header.cmd,
            attrs,
        })
    }
}

async fn eswitch_modes() -> std::io::Result<BTreeMap<String, EswitchMode>> {
    let (connection, mut handle, _) = genetlink::new_connection()?;
    let task = tokio::spawn(connection);
    let mut request = NetlinkMessage::from(GenlMessage::from_payload(DevlinkMessage {
        cmd: DEVLINK_CMD_GET,
        attrs: vec![],
    }));
    request.header.flags = NLM_F_REQUEST | netlink_packet_core::NLM_F_DUMP;
    let replies: Vec<_> = handle
        .request(request)
        .await
        .map_err(std::io::Error::other)?
        .collect()
        .await;
    let mut devices = Vec::new();
    for reply in replies {
        if let Ok(NetlinkMessage {
            payload: NetlinkPayload::InnerMessage(msg),
            ..
        }) = reply
        {
            let (mut bus, mut dev) = (None, None);
            for a in msg.payload.attrs {
                match a {
                    DevlinkAttr::BusName(b) => bus = Some(b),
                    DevlinkAttr::DevName(d) => dev = Some(d),
                    _ => {}
                }
            }
            if let (Some(bus), Some(dev)) = (bus, dev)
                && bus == "pci"
            {
                devices.push(dev);
            }
        }
    }
    let mut modes = BTreeMap::new();
    for dev in devices {
        let mut request = NetlinkMessage::from(GenlMessage::from_payload(DevlinkMessage {
            cmd: DEVLINK_CMD_ESWITCH_GET,
            attrs: vec![
                DevlinkAttr::BusName("pci".into()),
                DevlinkAttr::DevName(dev.clone()),
            ],
        }));
        request.header.flags = NLM_F_REQUEST;
        let Ok(stream) = handle.request(request).await else {
            continue;
        };
        let replies: Vec<_> = stream.collect().await;
        // A driver without an e-switch answers ENODEV/EOPNOTSUPP: that is legacy SR-IOV.
        let mut mode = EswitchMode::Legacy;
        for reply in replies.into_iter().flatten() {
            if let NetlinkPayload::InnerMessage(msg) = reply.payload {
                for a in msg.payload.attrs {
                    if let DevlinkAttr::EswitchMode(1) = a {
                        mode = EswitchMode::Switchdev;
                    }
                }
            }
        }
        modes.insert(dev, mode);
    }
    task.abort();
    Ok(modes)
}

/// Interfaces that carry the node's IPv4 or IPv6 default route, from `<root>/proc/net/route`
/// and `<root>/proc/net/ipv6_route`: giving one of them to a pod would cut the node off.
pub fn default_route_interfaces(root: &Path) -> BTreeSet<String> {
    // Bounded and regular-files-only like every read under the configurable root.
    let read = |path: &str| {
        crate::bounded::read_regular(&root.join(path), 4 << 20, crate::bounded::Links::Follow)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    };
    let v4 = read("proc/net/route");
    let v6 = read("proc/net/ipv6_route");
    let mut out = parse_ipv4_default_routes(&v4);
    out.extend(parse_ipv6_default_routes(&v6));
    out
}

/// `/proc/net/route`: `Iface Destination Gateway Flags RefCnt Use Metric Mask …`, hex fields.
pub fn parse_ipv4_default_routes(text: &str) -> BTreeSet<String> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.len() >= 8 && f[1] == "00000000" && f[7] == "00000000").then(|| f[0].to_string())
        })
        .collect()
}

/// `/proc/net/ipv6_route`: `dest plen src splen nexthop metric refcnt use flags iface`; the
/// kernel's `::/0` reject entries on `lo` are not routes out of the node.
pub fn parse_ipv6_default_routes(text: &str) -> BTreeSet<String> {
    const RTF_REJECT: u32 = 0x0200;
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[0].bytes().any(|b| b != b'0') || f[1] != "00" {
                return None;
            }
            let flags = u32::from_str_radix(f[8], 16).unwrap_or(0);
            (flags & RTF_REJECT == 0 && f[9] != "lo").then(|| f[9].to_string())
        })
        .collect()
}

/// A stream that yields once per rtnetlink link notification (new, changed or deleted link:
/// VF created, up/down, rename, MTU). Consumers coalesce bursts.
pub fn link_events() -> std::io::Result<impl Stream<Item = ()> + Send + Unpin> {
    use netlink_sys::{AsyncSocket, SocketAddr};
    let (mut connection, _handle, messages) = rtnetlink::new_connection()?;
    connection
        .socket_mut()
        .socket_mut()
        .bind(&SocketAddr::new(0, rtnetlink::constants::RTMGRP_LINK))?;
    tokio::spawn(connection);
    Ok(messages.map(|_| ()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_default_routes() {
        let text = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                    eth0\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                    eth0\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                    bond0\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n";
        let got: Vec<_> = parse_ipv4_default_routes(text).into_iter().collect();
        assert_eq!(got, vec!["bond0", "eth0"]);
    }

    #[test]
    fn ipv6_default_routes_skip_reject_entries() {
        let text = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003     eth1\n\
                    00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n\
                    20010db8000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth2\n";
        let got: Vec<_> = parse_ipv6_default_routes(text).into_iter().collect();
        assert_eq!(got, vec!["eth1"]);
    }

    #[test]
    fn devlink_eswitch_request_encodes_like_the_kernel_expects() {
        let msg = DevlinkMessage {
            cmd: DEVLINK_CMD_ESWITCH_GET,
            attrs: vec![
                DevlinkAttr::BusName("pci".into()),
                DevlinkAttr::DevName("0000:3b:00.0".into()),
            ],
        };
        let mut buf = vec![0u8; msg.buffer_len()];
        msg.emit(&mut buf);
        // nla_len 8 (4 header + "pci\0"), type 1; then nla_len 17 padded to 20, type 2.
        assert_eq!(&buf[..8], &[8, 0, 1, 0, b'p', b'c', b'i', 0]);
        assert_eq!(&buf[8..12], &[17, 0, 2, 0]);
        assert_eq!(&buf[12..25], b"0000:3b:00.0\0");
        let header = GenlHeader {
            cmd: DEVLINK_CMD_ESWITCH_GET,
            version: 1,
        };
        let mut reply = msg.clone();
        reply.attrs.push(DevlinkAttr::EswitchMode(1));
        let mut buf = vec![0u8; reply.buffer_len()];
        reply.emit(&mut buf);
        assert_eq!(
            DevlinkMessage::parse_with_param(&buf, header).unwrap(),
            reply
        );
    }
}

#[cfg(test)]
mod live_tests {
    /// Reads (never writes) the test process's own network namespace: loopback always exists.
    #[tokio::test]
    async fn snapshot_of_this_namespace_sees_loopback() {
        let snap = super::snapshot().await;
        let lo = snap.links.get("lo").expect("lo in the rtnetlink dump");
        assert_eq!(lo.oper_state.as_deref(), Some("unknown"));
        assert_eq!(lo.kind, None);
        let lo_features = snap.features.get("lo").expect("ethtool features of lo");
        assert!(lo_features.contains("loopback"), "{lo_features:?}");
    }
}
