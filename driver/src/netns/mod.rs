//! The only code that changes the kernel: moving a device into a pod's network namespace with
//! its name, MTU, MAC, addresses, routes and sysctls (and, for an SR-IOV VF, its settings on
//! the PF), and putting it back exactly as it was.
//!
//! Layout follows youki's network code: the kernel sits behind the small [`Kernel`] /
//! [`Session`] traits (an rtnetlink implementation in [`rtnl`], a recording fake in `fake` that
//! only tests compile),
//! and [`attach`] / [`detach`] are written once against them. Attach is two-phase so a crash
//! can never lose a device: [`capture`] reads what must be restored (the caller checkpoints it)
//! before [`attach`] changes anything, and a failing attach undoes every step it did.

mod attaching;
pub mod child;
mod detaching;
pub mod ethtool;
#[cfg(test)]
pub(crate) mod fake;
pub mod link;
pub mod overlay;
pub mod routing;
pub mod rtnl;
pub mod sysctl;
pub mod tbf;
pub mod uplink;
pub mod vf;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;

use knic_proto::netconfig::{Addressing, Bandwidth, ChildKind, Cidr, EthtoolSettings, Route};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use attaching::attach;
pub use detaching::detach;
pub use link::LinkSettings;
pub use tbf::Tbf;
pub use uplink::Uplink;
pub use vf::{VfPlan, VfState};

/// A network namespace an operation runs in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Ns {
    /// The node's namespace (the driver runs with hostNetwork; tests use a throwaway one).
    Host,
    /// A pod's namespace, by its bind-mount path (e.g. `/var/run/netns/cni-…`).
    Pod(PathBuf),
}

impl std::fmt::Display for Ns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ns::Host => f.write_str("host"),
            Ns::Pod(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A link as the kernel reports it, with what detach must restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkState {
    /// ifindex (kept across namespace moves when free; used to find a device the kernel
    /// returned by itself under another name).
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// MTU.
    pub mtu: u32,
    /// MAC address, when the link has a 6-byte one.
    pub mac: Option<[u8; 6]>,
    /// Administratively up.
    pub up: bool,
    /// Global-scope addresses (link-local ones come back by themselves).
    pub addresses: Vec<Cidr>,
    /// `IFLA_INFO_KIND` (veth, macvlan, vlan…); `None` for physical devices.
    pub kind: Option<String>,
    /// The burned-in MAC (`IFLA_PERM_ADDRESS`), which a rename or `ip link set address` does
    /// not change; only physical devices have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permanent_mac: Option<[u8; 6]>,
    /// The PCI function behind the netdev (`IFLA_PARENT_DEV_NAME` on the `pci` bus).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
}

/// What makes a prepared device that device and not merely whatever carries its name when the
/// pod starts: interface names are the host admin's to change, so attach checks this before it
/// moves anything (a renamed, unoffered interface must never end up in a pod).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "by")]
pub enum DeviceIdentity {
    /// A PCI function (NIC port, PF, VF): its address survives renames and MAC changes.
    Pci {
        /// `0000:a2:00.0`.
        address: String,
        /// The MAC it was published with: checked instead where the kernel does not name a
        /// netdev's PCI parent (before Linux 5.16, or behind virtio, whose parent is `virtioN`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mac: Option<[u8; 6]>,
    },
    /// A netdev without a PCI function (veth, macvlan…): its MAC as discovered, compared
    /// with the permanent MAC when the device has one, else with the current one.
    Mac {
        /// The MAC the device was published with.
        address: [u8; 6],
    },
}

impl std::fmt::Display for DeviceIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceIdentity::Pci { address, .. } => write!(f, "PCI function {address}"),
            DeviceIdentity::Mac { address } => write!(f, "MAC {}", mac_text(address)),
        }
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn mac_text(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// `None` when `link` carries `mac`, as its permanent MAC or (discovery publishes the current
/// one) as its current MAC.
fn mac_mismatch(mac: &[u8; 6], link: &LinkState) -> Option<String> {
    if link.permanent_mac.as_ref() == Some(mac) || link.mac.as_ref() == Some(mac) {
        return None;
    }
    Some(match link.permanent_mac.or(link.mac) {
        Some(found) => format!("MAC {}", mac_text(&found)),
        None => "a device without a MAC".to_owned(),
    })
}

impl DeviceIdentity {
    /// `None` when `link` is this device; otherwise what `link` is instead, for the error.
    fn mismatch(&self, link: &LinkState) -> Option<String> {
        match self {
            DeviceIdentity::Pci { address, mac } => match (&link.pci_address, mac) {
                (Some(found), _) if found == address => None,
                (Some(found), _) => Some(format!("PCI function {found}")),
                // The kernel does not say: the MAC is the next best witness.
                (None, Some(mac)) => mac_mismatch(mac, link),
                (None, None) => None,
            },
            DeviceIdentity::Mac { address } => mac_mismatch(address, link),
        }
    }
}

/// Link attributes to change; `None` leaves one alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkChange {
    /// New name.
    pub name: Option<String>,
    /// New MTU.
    pub mtu: Option<u32>,
    /// New MAC.
    pub mac: Option<[u8; 6]>,
    /// Admin state.
    pub up: Option<bool>,
    /// IPv4 per-interface sysctls as (`IPV4_DEVCONF_*` id, value), see [`sysctl`]. The
    /// kernel applies them after the admin state, so a change that has them must not set
    /// `up`; only a move and a change send them (a creation with `IFLA_AF_SPEC` fails with
    /// EAFNOSUPPORT).
    pub ipv4_conf: Vec<(u16, u32)>,
    /// GSO/GRO maximum sizes (see [`link`]); empty leaves them alone.
    pub sizes: knic_proto::netconfig::OffloadSizes,
    /// On a move, the ifindex to ask for in the target namespace (`IFLA_NEW_IFINDEX`; none:
    /// the device's current one). A device going home asks for the one it had, so the host
    /// sees it as before also when the pod's namespace had given it another. Anything but a
    /// move leaves it unread (an index cannot change in place).
    pub index: Option<u32>,
}

/// Operations inside one namespace. A session is opened per attach/detach and dropped after,
/// never cached: an open netlink socket would keep a deleted pod namespace alive, and with it
/// a physical device the kernel should hand back to the host.
pub trait Session: Send {
    /// The link named `name`, if present, without its addresses (one request; the session
    /// remembers its index for the requests that follow).
    fn find_link(&mut self, name: &str) -> impl Future<Output = Result<Option<LinkState>>> + Send;
    /// The global-scope addresses of the link with ifindex `index` (one dump, so only where
    /// they are needed: capture and a detach whose device came back by itself).
    fn addresses(&mut self, index: u32) -> impl Future<Output = Result<Vec<Cidr>>> + Send;
    /// The link named `name` with its addresses, if present.
    fn link(&mut self, name: &str) -> impl Future<Output = Result<Option<LinkState>>> + Send {
        async move {
            let Some(mut link) = self.find_link(name).await? else {
                return Ok(None);
            };
            link.addresses = self.addresses(link.index).await?;
            Ok(Some(link))
        }
    }
    /// The GSO/GRO maximum sizes the kernel reports for `name` (one RTM_GETLINK); a size it
    /// does not report is `None`. `None` for a missing link.
    fn offload_sizes(
        &mut self,
        name: &str,
    ) -> impl Future<Output = Result<Option<knic_proto::netconfig::OffloadSizes>>> + Send;
    /// Every link, without addresses (to find a device the kernel returned under another
    /// name, or the host VLANs knic made).
    fn links(&mut self) -> impl Future<Output = Result<Vec<LinkState>>> + Send;
    /// Moves `name` into `to` with its new name, MTU and MAC in one RTM_NEWLINK, so the device
    /// never appears in the target under a temporary name. Returns its ifindex in `to` when
    /// known without a lookup (the kernel was asked to keep it, `IFLA_NEW_IFINDEX`), so a
    /// session there can [`Session::remember`] it instead of looking the device up again.
    fn move_link(
        &mut self,
        name: &str,
        to: &Ns,
        change: &LinkChange,
    ) -> impl Future<Output = Result<Option<u32>>> + Send;
    /// Tells the session the ifindex of `name` in its namespace, learned elsewhere (a move
    /// into it): the requests that follow need no lookup.
    fn remember(&mut self, name: &str, index: u32);
    /// Changes attributes of a link in this namespace.
    fn set_link(
        &mut self,
        name: &str,
        change: &LinkChange,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Adds addresses (IPv6 without duplicate address detection, so they are usable at once);
    /// one already there is fine. Every request is sent before the first answer is read, so
    /// they cost one round trip together.
    fn add_addresses(
        &mut self,
        name: &str,
        addresses: &[Cidr],
    ) -> impl Future<Output = Result<()>> + Send;
    /// Adds routes through `name` (one already there is fine), pipelined like
    /// [`Session::add_addresses`].
    fn add_routes(
        &mut self,
        name: &str,
        routes: &[Route],
    ) -> impl Future<Output = Result<()>> + Send;
    /// Deletes routes through `name` (one already gone is fine), pipelined like
    /// [`Session::add_routes`]: a live update of a Network takes back the routes it dropped.
    fn del_routes(
        &mut self,
        name: &str,
        routes: &[Route],
    ) -> impl Future<Output = Result<()>> + Send;
    /// Adds permanent ARP/NDP entries on `name`, replacing any entry of the same address
    /// (pipelined like [`Session::add_addresses`]); a refusal names the entry and the kernel's
    /// text.
    fn set_neighbors(
        &mut self,
        name: &str,
        neighbors: &[knic_proto::netconfig::Neighbor],
    ) -> impl Future<Output = Result<()>> + Send;
    /// Writes per-interface sysctls (`ipv4.arp_ignore` style keys) of `name`.
    fn set_sysctls(
        &mut self,
        name: &str,
        sysctls: &BTreeMap<String, String>,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Creates a child of `parent` (a link of this session's namespace) directly in `to`,
    /// named, sized and addressed per `change`, in one RTM_NEWLINK: no temporary name on the
    /// host and no move (a move between namespaces waits in `rcu_barrier()` under RTNL,
    /// ~16 ms here; a creation in place takes ~0.3 ms).
    fn add_child(
        &mut self,
        parent: &str,
        child: NewChild<'_>,
        to: &Ns,
        change: &LinkChange,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Deletes a link.
    fn del_link(&mut self, name: &str) -> impl Future<Output = Result<()>> + Send;
    /// Creates the bridge and the VXLAN device of `segment` where they are missing (one
    /// already there must be exactly knic's: a bridge, a VXLAN device of this VNI, port and
    /// local address), both up; a repeated call changes nothing.
    fn ensure_segment(
        &mut self,
        segment: &overlay::Segment,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Creates a veth whose end `host` sits on `bridge` here and whose peer is created directly
    /// in `to`, named, sized and addressed per `change`, in one RTM_NEWLINK (no move, as for
    /// [`Session::add_child`]); `mtu` is the host end's and the peer's unless `change` says.
    fn add_veth(
        &mut self,
        host: &str,
        bridge: &str,
        to: &Ns,
        mtu: u32,
        change: &LinkChange,
    ) -> impl Future<Output = Result<()>> + Send;
    /// The static remote forwarding entries of the VXLAN device `vxlan` (none when it is gone).
    fn fdb(&mut self, vxlan: &str) -> impl Future<Output = Result<Vec<overlay::FdbEntry>>> + Send;
    /// Adds and removes forwarding entries of `vxlan`, pipelined; an entry already there (or
    /// already gone) is fine, and a MAC's entry is replaced when the MAC moved node.
    fn set_fdb(
        &mut self,
        vxlan: &str,
        add: &[overlay::FdbEntry],
        remove: &[overlay::FdbEntry],
    ) -> impl Future<Output = Result<()>> + Send;
    /// Makes `tbf` the root qdisc of `name`, creating it or changing knic's own in place (a
    /// repeated call is a no-op).
    fn set_egress_limit(
        &mut self,
        name: &str,
        tbf: &Tbf,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Removes a TBF root qdisc from `name`; nothing to remove is success.
    fn clear_egress_limit(&mut self, name: &str) -> impl Future<Output = Result<()>> + Send;
    /// VF `index` of the PF `pf` as the PF reports it (its `IFLA_VFINFO_LIST` entry); `None`
    /// when the PF has no such VF.
    fn vf_state(
        &mut self,
        pf: &str,
        index: u32,
    ) -> impl Future<Output = Result<Option<VfState>>> + Send;
    /// Sets, through the PF `pf`, the parts of VF `index` that `state` holds, in one message.
    fn set_vf(
        &mut self,
        pf: &str,
        index: u32,
        state: &VfState,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Adds policy rules (`ip rule add`); one already there is fine. Pipelined.
    fn add_rules(&mut self, rules: &[routing::Rule]) -> impl Future<Output = Result<()>> + Send;
    /// Deletes policy rules; one already gone is fine. Pipelined.
    fn del_rules(&mut self, rules: &[routing::Rule]) -> impl Future<Output = Result<()>> + Send;
    /// The link `name` as a VRF (its table, `None` when it is not a VRF, and the names of its
    /// members); `None` when no link has that name.
    fn vrf(&mut self, name: &str) -> impl Future<Output = Result<Option<routing::VrfLink>>> + Send;
    /// Creates the VRF device `vrf` in this namespace, up.
    fn add_vrf(&mut self, vrf: &routing::Vrf) -> impl Future<Output = Result<()>> + Send;
    /// Enslaves `name` to the link `master` (`IFLA_MASTER`).
    fn set_master(&mut self, name: &str, master: &str) -> impl Future<Output = Result<()>> + Send;
    /// What `name` reports (ethtool netlink) for the parts `asked` names: its features when
    /// it asks any, its ring sizes, channel counts or coalescing when it asks those.
    fn ethtool_state(
        &mut self,
        name: &str,
        asked: &EthtoolSettings,
    ) -> impl Future<Output = Result<ethtool::EthtoolState>> + Send;
    /// Sends `settings` (kernel feature names only, see [`ethtool::changes`]) to `name`, one
    /// request per part, refusals naming the part and the kernel's text.
    fn set_ethtool(
        &mut self,
        name: &str,
        settings: &EthtoolSettings,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// Opens sessions; the one thing the executor needs from the outside world.
pub trait Kernel: Send + Sync + 'static {
    /// The session type.
    type Session: Session;
    /// A session in `ns`; a pod namespace that no longer exists is `Ok(None)`.
    fn open(&self, ns: &Ns) -> impl Future<Output = Result<Option<Self::Session>>> + Send;
}

/// How the device reaches the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum AttachMode {
    /// The device itself moves into the pod (NIC, VF, or a veth/macvlan playing one).
    Move,
    /// An 802.1Q child of the device goes into the pod; the device stays on the host.
    Vlan {
        /// VLAN id.
        id: u16,
    },
    /// A macvlan or ipvlan child of the device goes into the pod; the device stays on the
    /// host and other pods may get children of it too.
    Child {
        /// Kind and mode.
        child: ChildKind,
        /// The host-side VLAN of the device the child sits on, shared with every other pod
        /// on that VLAN of that port; `None`: the child sits on the device itself.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        uplink: Option<Uplink>,
    },
    /// A veth whose peer is created in the pod and whose host end joins the node's bridge of
    /// an overlay segment (bridge + VXLAN device, shared by every pod of the VNI on the node,
    /// made with the first and deleted after the last, like a shared host VLAN).
    Overlay {
        /// The segment the host end joins.
        segment: overlay::Segment,
        /// The host end's name (`knh` + 12 hex digits of the claim and interface).
        host_veth: String,
    },
}

/// A child link knic creates on a host device, directly in a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewChild<'a> {
    /// An 802.1Q VLAN with this id.
    Vlan(u16),
    /// A macvlan or ipvlan in its mode.
    Of(&'a ChildKind),
}

impl NewChild<'_> {
    /// Its `IFLA_INFO_KIND`.
    pub fn kind(self) -> &'static str {
        match self {
            NewChild::Vlan(_) => "vlan",
            NewChild::Of(ChildKind::Macvlan(_)) => "macvlan",
            NewChild::Of(ChildKind::Ipvlan(_)) => "ipvlan",
        }
    }
}

impl AttachMode {
    /// The child the pod gets, when it gets one rather than the device itself.
    pub fn new_child(&self) -> Option<NewChild<'_>> {
        match self {
            AttachMode::Move | AttachMode::Overlay { .. } => None,
            AttachMode::Vlan { id } => Some(NewChild::Vlan(*id)),
            AttachMode::Child { child, .. } => Some(NewChild::Of(child)),
        }
    }

    /// The `IFLA_INFO_KIND` of the link the pod gets when knic created it (rather than moving
    /// the device).
    pub fn child_kind(&self) -> Option<&'static str> {
        match self {
            AttachMode::Overlay { .. } => Some("veth"),
            _ => self.new_child().map(NewChild::kind),
        }
    }

    /// The shared host VLAN the pod's child sits on, if any.
    pub fn uplink(&self) -> Option<&Uplink> {
        match self {
            AttachMode::Child { uplink, .. } => uplink.as_ref(),
            AttachMode::Move | AttachMode::Vlan { .. } | AttachMode::Overlay { .. } => None,
        }
    }

    /// The host link this attachment shares with other pods and keeps alive while recorded:
    /// a shared host VLAN's name, or an overlay segment's bridge (which names its VXLAN
    /// device too, see [`overlay::segment_vni`]).
    pub fn shared_host_link(&self) -> Option<&str> {
        match self {
            AttachMode::Overlay { segment, .. } => Some(&segment.bridge),
            _ => self.uplink().map(|u| u.name.as_str()),
        }
    }
}

/// Everything attach needs, computed at prepare time (a pure function of claim, device and
/// configuration) and checkpointed, so the NRI hook does no decision-making under its timeout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachPlan {
    /// Pool of the allocated device.
    pub pool: String,
    /// Allocated device name.
    pub device: String,
    /// The claim request it serves.
    pub request: String,
    /// The device's netdev on the host, as discovered.
    pub host_ifname: String,
    /// Move or VLAN child.
    pub mode: AttachMode,
    /// Name inside the pod.
    pub pod_ifname: String,
    /// MTU inside the pod.
    pub mtu: Option<u32>,
    /// MAC inside the pod.
    pub mac: Option<[u8; 6]>,
    /// Addresses inside the pod.
    pub addresses: Vec<Cidr>,
    /// Routes inside the pod.
    pub routes: Vec<Route>,
    /// Per-interface sysctls inside the pod.
    pub sysctls: BTreeMap<String, String>,
    /// What the device was when it was published; `None` only in checkpoints written before
    /// knic recorded it (those attach by name, as they did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<DeviceIdentity>,
    /// SR-IOV settings made through the VF's PF before the device moves; `None` for devices
    /// without any (and in checkpoints written before knic had them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vf: Option<VfPlan>,
    /// Egress limit of the pod's interface, from the config's `bandwidth` or the allocation's
    /// consumed `bandwidth` capacity; `None` for no limit (and in checkpoints written before
    /// knic had limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<Bandwidth>,
    /// The Network the attachment belongs to (the claim's `knic.dev/network` label, else the
    /// config's `ipam.network`), so a change of that Network finds the pods it must update
    /// live. `None` for a hand-configured device and in checkpoints written before knic
    /// recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// The claim came from the Network's generated template (it carries the label), so the
    /// Network's `mtu` is the pod's; a hand-written claim's MTU is its own and a live update
    /// leaves it alone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_template: bool,
    /// Policy rules and the VRF of the interface, installed in the pod and taken back on
    /// detach (the routes of source-based routing and of a VRF are in `routes`, in their
    /// table); empty for none and in checkpoints written before knic had them.
    #[serde(default, skip_serializing_if = "routing::PodRouting::is_empty")]
    pub routing: routing::PodRouting,
    /// ethtool settings of the pod's interface, applied in the pod before it goes up; `None`
    /// for none (and in checkpoints written before knic had them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ethtool: Option<EthtoolSettings>,
    /// Static neighbors and GSO/GRO sizes of the pod's link (issue 27); empty in checkpoints
    /// written before knic had them.
    #[serde(default, skip_serializing_if = "LinkSettings::is_empty")]
    pub link: LinkSettings,
    /// How the pod's interface gets addresses beyond `addresses` (DHCP, SLAAC, unnumbered);
    /// omitted when static, so older checkpoints load the same.
    #[serde(default, skip_serializing_if = "Addressing::is_static")]
    pub addressing: Addressing,
}

impl AttachPlan {
    /// The host-side name knic gave a VLAN child before it created children in the pod
    /// directly: detach still deletes a leftover of that (a crash between create and move of
    /// an older version). Short (≤ 15 bytes), `knic`-prefixed, unique per device.
    pub fn vlan_temp_name(&self) -> String {
        let hash = self.device.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        format!("knic{:08x}", hash as u32)
    }
}

/// What detach needs to put the node back: recorded before anything changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Restore {
    /// The device's host state before attach (for a VLAN child: the parent's, unchanged).
    pub host: LinkState,
    /// The previous values of exactly the VF settings the plan changes, as the PF reported
    /// them; `None` when the plan changes none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vf: Option<VfState>,
    /// The previous values of exactly the ethtool settings the plan changes on a moved device,
    /// read on the host before the move; `None` when it changes none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ethtool: Option<EthtoolSettings>,
    /// The previous values of exactly the GSO/GRO sizes the plan changes on a moved device;
    /// `None` when it changes none (and for children, which are created fresh).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sizes: Option<knic_proto::netconfig::OffloadSizes>,
}

/// Reads the host state of the plan's device; the caller checkpoints it before [`attach`].
/// Refuses, before anything changes, when the interface under the prepared name is not the
/// prepared device.
pub async fn capture<K: Kernel>(kernel: &K, plan: &AttachPlan) -> Result<Restore> {
    let mut host = open(kernel, &Ns::Host).await?;
    let link = host.link(&plan.host_ifname).await?.ok_or_else(|| {
        Error::kernel(
            Ns::Host,
            format!("reading device {}/{}", plan.pool, plan.device),
            format!(
                "interface {} is not in the host namespace",
                plan.host_ifname
            ),
        )
    })?;
    if let Some(identity) = &plan.identity
        && let Some(found) = identity.mismatch(&link)
    {
        return Err(Error::DeviceMismatch {
            device: format!("{}/{}", plan.pool, plan.device),
            ifname: plan.host_ifname.clone(),
            prepared: identity.to_string(),
            found,
        });
    }
    let vf = match &plan.vf {
        Some(vf) => {
            let current = host.vf_state(&vf.pf, vf.index).await?.ok_or_else(|| {
                Error::kernel(
                    Ns::Host,
                    format!("reading VF {} of {}", vf.index, vf.pf),
                    format!(
                        "PF {} has no VF {} (were its VFs re-created?)",
                        vf.pf, vf.index
                    ),
                )
            })?;
            let mut previous = vf::previous(&vf::request(&vf.settings, &current), &current);
            // A PF reports the MAC its VF registered for itself as the VF's MAC too (igb
            // does): put back through the PF, it would become one the PF assigns and
            // enforces, and the VF could never change its MAC again. The netdev carrying it
            // says it is the VF's own: the assignment is cleared instead (all zeros), and the
            // netdev's MAC goes back through the VF (see `detaching::restore_vf_mac`).
            if previous.mac.is_some() && previous.mac == link.mac {
                previous.mac = Some([0; 6]);
            }
            Some(previous)
        }
        None => None,
    };
    let ethtool = match (&plan.ethtool, &plan.mode) {
        (Some(asked), AttachMode::Move) => {
            Some(ethtool::record(&mut host, &Ns::Host, &plan.host_ifname, asked).await?)
                .filter(|previous| !previous.is_empty())
        }
        _ => None,
    };
    let sizes = link::capture_sizes(&mut host, plan).await?;
    Ok(Restore {
        host: link,
        vf,
        ethtool,
        sizes,
    })
}

pub(crate) async fn open<K: Kernel>(kernel: &K, ns: &Ns) -> Result<K::Session> {
    kernel
        .open(ns)
        .await?
        .ok_or_else(|| Error::kernel(ns, "entering the network namespace", "it does not exist"))
}

/// Whether `link` (in the pod) is the plan's device: ifindexes are per namespace and can
/// coincide, so the MAC the device carries in the pod must match too. A VF whose MAC the plan sets through the PF carries it in the pod too, because the plan
/// then also asks for it as the netdev's MAC (see `claims::plan`).
fn is_same_device(link: &LinkState, plan: &AttachPlan, restore: &Restore) -> bool {
    link.index == restore.host.index
        && link.mac == plan.mac.or(restore.host.mac)
        && same_hardware(link, &restore.host)
}

/// Whether `link` is the hardware `original` recorded, by what the record has (checkpoints
/// written before knic read these have neither, and the device must still come home after an
/// upgrade): its PCI function, which nothing changes while the netdev exists; the permanent
/// MAC only without one. A VF's permanent MAC is not burned in: igbvf has none until its driver
/// resets under a MAC the PF assigned, then takes that one (a claim's `vf.mac`, when the netdev
/// opens in the pod) and keeps it, so the next claim of the VF would find it changed.
pub(crate) fn same_hardware(link: &LinkState, original: &LinkState) -> bool {
    match &original.pci_address {
        Some(pci) => link.pci_address.as_ref() == Some(pci),
        None => original.permanent_mac.is_none() || link.permanent_mac == original.permanent_mac,
    }
}

#[cfg(test)]
mod tests;
