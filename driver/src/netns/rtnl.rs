//! The kernel, through rtnetlink. Each session owns one netlink socket created inside its
//! namespace and used synchronously (see [`wire`]): a socket stays bound to the namespace it
//! was created in, so the calling thread `setns`es into the pod's namespace only for the
//! synchronous call that creates the socket (or opens sysctl files) and straight back, with
//! no await in between, so no other task ever runs there. A session in the process's own
//! namespace needs no switch at all. (A thread per session cost ~1–2 ms per open on a loaded
//! node, and an async connection per session 10–20 µs per request: most of knic's cost above
//! the kernel's.)

mod addressing;
mod ethtool;
mod link;
mod overlay;
mod routing;
mod wire;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use knic_proto::netconfig::{Cidr, Route};
use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NetlinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use nix::sched::{CloneFlags, setns};
use rtnetlink::LinkUnspec;

use super::tbf::{self, Tbf};
use super::vf::{self, VfState};
use super::{Kernel, LinkChange, LinkState, NewChild, Ns, Session};
use crate::error::{Error, Result};
use wire::{Failure, Wire};

/// The real kernel. `host` is the node's namespace: `None` for the process's own (production:
/// the driver runs with hostNetwork), or a path (tests use a throwaway `knt-` namespace).
#[derive(Debug, Clone)]
pub struct Rtnl {
    host: Option<PathBuf>,
    sysctl_root: PathBuf,
    /// Netlink requests sent by every session of this kernel (and its clones), for the
    /// benchmark and the tests that hold the executor to its request budget.
    requests: Arc<AtomicU64>,
}

/// Where per-interface sysctls are written unless [`Rtnl::with_sysctl_root`] says otherwise.
pub const DEFAULT_SYSCTL_ROOT: &str = "/proc/sys/net";

impl Rtnl {
    /// The kernel with `host` as the node's namespace.
    pub fn new(host: Option<PathBuf>) -> Self {
        Rtnl {
            host,
            sysctl_root: PathBuf::from(DEFAULT_SYSCTL_ROOT),
            requests: Arc::default(),
        }
    }

    /// Netlink requests sent so far by this kernel's sessions (a dump counts as one).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Writes sysctls under `root` instead of `/proc/sys/net`: an unprivileged container sees
    /// its own `/proc/sys` read-only, but the host's `/proc/sys/net` mounted elsewhere is
    /// writable with CAP_NET_ADMIN, and its files still resolve to the namespace of the thread
    /// that opens them.
    pub fn with_sysctl_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.sysctl_root = root.into();
        self
    }

    fn host_path(&self) -> PathBuf {
        self.host
            .clone()
            .unwrap_or_else(|| PathBuf::from("/proc/self/ns/net"))
    }
}

/// One rtnetlink socket in one namespace. Opened per attach/detach (a socket costs one
/// syscall), never pooled: an open socket would keep a deleted pod namespace alive.
pub struct RtnlSession {
    wire: Wire,
    /// The namespace file, for sysctl writes (`None`: the process's own).
    ns_path: Option<PathBuf>,
    host_path: PathBuf,
    sysctl_root: PathBuf,
    /// ifindex by name, as looked up (or renamed) in this session: one lookup per name.
    indexes: HashMap<String, u32>,
    requests: Arc<AtomicU64>,
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(context, e)
}

fn nl(context: String) -> impl FnOnce(Failure) -> Error {
    move |e| Error::io(context, e.into_io())
}

thread_local! {
    /// This thread's own network namespace, to come back to after a switch (opened once per
    /// thread: every switch returns the thread to it).
    static HOME: std::result::Result<File, String> =
        File::open("/proc/thread-self/ns/net").map_err(|e| e.to_string());
}

/// Runs `f` on the calling thread inside the namespace at `path` (or, for `None`, where the
/// thread is). `f` must be synchronous: the thread is back in its own namespace before this
/// returns, also when `f` panics.
fn in_namespace<T>(
    path: Option<&Path>,
    f: impl FnOnce() -> std::io::Result<T>,
) -> std::io::Result<T> {
    let Some(path) = path else {
        return f();
    };
    let target = File::open(path)?;
    let home = HOME.with(|home| match home {
        Ok(file) => file.try_clone(),
        Err(e) => Err(std::io::Error::other(format!(
            "opening this thread's network namespace: {e}"
        ))),
    })?;
    setns(&target, CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
    let _back = Return(home);
    f()
}

/// Puts the thread back into the namespace it came from. A thread that cannot go back would
/// run every later task of this runtime in a pod's namespace: the process aborts instead (the
/// kernel refuses the switch back only if the namespace file were not a network namespace,
/// which it is: it was the thread's own a moment ago).
struct Return(File);

impl Drop for Return {
    fn drop(&mut self) {
        if let Err(e) = setns(&self.0, CloneFlags::CLONE_NEWNET) {
            tracing::error!(error = %e, "could not return to the driver's network namespace");
            std::process::abort();
        }
    }
}

impl Kernel for Rtnl {
    type Session = RtnlSession;

    async fn open(&self, ns: &Ns) -> Result<Option<RtnlSession>> {
        let ns_path = match ns {
            Ns::Host => self.host.clone(),
            Ns::Pod(p) => {
                if !p.exists() {
                    return Ok(None);
                }
                Some(p.clone())
            }
        };
        let wire = in_namespace(ns_path.as_deref(), Wire::open)
            .map_err(io(format!("opening rtnetlink in namespace {ns}")))?;
        Ok(Some(RtnlSession {
            wire,
            ns_path,
            host_path: self.host_path(),
            sysctl_root: self.sysctl_root.clone(),
            indexes: HashMap::new(),
            requests: Arc::clone(&self.requests),
        }))
    }
}

fn state(msg: &LinkMessage) -> LinkState {
    let mut s = LinkState {
        index: msg.header.index,
        name: String::new(),
        mtu: 0,
        mac: None,
        up: msg.header.flags.contains(LinkFlags::Up),
        addresses: Vec::new(),
        kind: None,
        permanent_mac: None,
        pci_address: None,
    };
    let mut parent: Option<&String> = None;
    let mut on_pci = false;
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::PermAddress(a) if a.len() == 6 && a.iter().any(|b| *b != 0) => {
                let mut mac = [0u8; 6];
                mac.copy_from_slice(a);
                s.permanent_mac = Some(mac);
            }
            LinkAttribute::ParentDevName(name) => parent = Some(name),
            LinkAttribute::ParentDevBusName(bus) => on_pci = bus == "pci",
            LinkAttribute::IfName(n) => s.name = n.clone(),
            LinkAttribute::Mtu(m) => s.mtu = *m,
            LinkAttribute::Address(a) if a.len() == 6 => {
                let mut mac = [0u8; 6];
                mac.copy_from_slice(a);
                s.mac = Some(mac);
            }
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    if let LinkInfo::Kind(k) = i {
                        s.kind = Some(k.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    if on_pci {
        s.pci_address = parent.cloned();
    }
    s
}

/// `EEXIST`: what a creation finds already there is fine (a repeated attach).
const EEXIST: i32 = 17;
/// `ENOENT`: the kernel's answer to an unknown qdisc kind, and to deleting a default qdisc.
const ENOENT: i32 = 2;
/// `ENODEV`: the link is gone (since this session looked it up), or never was.
const ENODEV: i32 = 19;
/// `EBUSY`: the ifindex a move asked to keep is taken in the target namespace.
const EBUSY: i32 = 16;
/// `EOPNOTSUPP`: the kernel lacks the link kind (no 8021q, ipvlan… module).
const EOPNOTSUPP: i32 = 95;

/// A request with the flags of a change (`ip link set`, `ip addr add`): acknowledged, and
/// creating only what is not there.
fn change(message: RouteNetlinkMessage) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut req = NetlinkMessage::from(message);
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE;
    req
}

impl RtnlSession {
    fn sent(&self, requests: u64) {
        self.requests.fetch_add(requests, Ordering::Relaxed);
    }

    async fn find(&mut self, name: &str) -> Result<Option<LinkMessage>> {
        self.sent(1);
        let mut get = LinkMessage::default();
        get.attributes.push(LinkAttribute::IfName(name.to_owned()));
        let request = NetlinkMessage::from(RouteNetlinkMessage::GetLink(get));
        match self.wire.request(request) {
            Ok(replies) => {
                let link = replies.into_iter().find_map(|m| match m {
                    RouteNetlinkMessage::NewLink(l) => Some(l),
                    _ => None,
                });
                if let Some(l) = &link {
                    self.indexes.insert(name.to_owned(), l.header.index);
                }
                Ok(link)
            }
            Err(e) if e.errno() == Some(ENODEV) => Ok(None),
            Err(e) => Err(nl(format!("reading link {name}"))(e)),
        }
    }

    /// The ifindex of `name`, looked up once per session.
    async fn index(&mut self, name: &str) -> Result<u32> {
        if let Some(index) = self.indexes.get(name) {
            return Ok(*index);
        }
        self.find(name)
            .await?
            .map(|l| l.header.index)
            .ok_or_else(|| {
                Error::kernel(
                    self.describe(),
                    format!("looking up {name}"),
                    format!("interface {name} does not exist"),
                )
            })
    }

    /// Sends `request` and returns its replies, or the kernel's refusal.
    fn exchange(
        &mut self,
        request: NetlinkMessage<RouteNetlinkMessage>,
    ) -> std::result::Result<Vec<RouteNetlinkMessage>, Failure> {
        self.sent(1);
        self.wire.request(request)
    }

    fn describe(&self) -> String {
        self.ns_path
            .as_ref()
            .map_or_else(|| "host".to_string(), |p| p.display().to_string())
    }

    fn change_message(
        index: u32,
        change: &LinkChange,
    ) -> rtnetlink::LinkMessageBuilder<LinkUnspec> {
        let mut b = LinkUnspec::new_with_index(index);
        if let Some(name) = &change.name {
            b = b.name(name.clone());
        }
        if let Some(mtu) = change.mtu {
            b = b.mtu(mtu);
        }
        if let Some(mac) = change.mac {
            b = b.address(mac.to_vec());
        }
        match change.up {
            Some(true) => b = b.up(),
            Some(false) => b = b.down(),
            None => {}
        }
        b
    }

    /// `IFLA_AF_SPEC` with the change's IPv4 sysctls, if it has any (raw: the crate's
    /// `DevConfRequest` leaves out every zero value, so it cannot set one to 0).
    fn add_ipv4_conf(msg: &mut LinkMessage, change: &LinkChange) {
        if !change.ipv4_conf.is_empty() {
            msg.attributes
                .push(LinkAttribute::AfSpecUnknown(super::sysctl::af_spec(
                    &change.ipv4_conf,
                )));
        }
    }

    /// Sends every request (creations: an existing object is fine) in one `sendmsg`, so the
    /// kernel's acknowledgements come back in one round trip. The first failure is returned
    /// with its request's context.
    async fn create_all(&mut self, requests: Vec<(RouteNetlinkMessage, String)>) -> Result<()> {
        let (messages, contexts): (Vec<_>, Vec<_>) = requests
            .into_iter()
            .map(|(message, context)| (change(message), context))
            .unzip();
        self.sent(messages.len() as u64);
        let context = contexts.first().cloned().unwrap_or_default();
        let answers = self.wire.requests(messages).map_err(io(context))?;
        for (answer, context) in answers.into_iter().zip(contexts) {
            if let Err(refused) = answer
                && refused.errno != EEXIST
            {
                return Err(Error::io(context, refused.to_io()));
            }
        }
        Ok(())
    }
}

impl Session for RtnlSession {
    async fn find_link(&mut self, name: &str) -> Result<Option<LinkState>> {
        Ok(self.find(name).await?.as_ref().map(state))
    }

    async fn addresses(&mut self, index: u32) -> Result<Vec<Cidr>> {
        self.read_addresses(index).await
    }

    async fn links(&mut self) -> Result<Vec<LinkState>> {
        self.sent(1);
        let dump = NetlinkMessage::from(RouteNetlinkMessage::GetLink(LinkMessage::default()));
        let replies = self.wire.dump(dump).map_err(nl("listing links".into()))?;
        Ok(replies
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(state(l)),
                _ => None,
            })
            .collect())
    }

    async fn move_link(&mut self, name: &str, to: &Ns, change: &LinkChange) -> Result<Option<u32>> {
        let index = self.index(name).await?;
        let target = match to {
            Ns::Host => self.host_path.clone(),
            Ns::Pod(p) => p.clone(),
        };
        let fd =
            File::open(&target).map_err(io(format!("opening namespace {}", target.display())))?;
        // IFLA_NET_NS_FD plus IFLA_IFNAME/IFLA_MTU/IFLA_ADDRESS/IFLA_AF_SPEC in one
        // RTM_NEWLINK: the kernel moves first, then applies the rest inside the target
        // namespace (the IPv4 sysctls to the device's new in_device).
        let wanted = change.index.unwrap_or(index);
        let message = |keep_index: bool| {
            let mut msg = Self::change_message(index, change)
                .setns_by_fd(fd.as_raw_fd())
                .build();
            Self::add_ipv4_conf(&mut msg, change);
            super::link::add_sizes(&mut msg, &change.sizes);
            if keep_index {
                msg.attributes.push(LinkAttribute::NewIfIndex(
                    i32::try_from(wanted).unwrap_or(0),
                ));
            }
            self::change(RouteNetlinkMessage::SetLink(msg))
        };
        let keep_index = keeps_index_on_request() && i32::try_from(wanted).is_ok();
        let context = || format!("moving {name} into namespace {to}");
        // Gone from this namespace, also when the kernel moved it and then refused the name.
        self.indexes.remove(name);
        match blocking(|| self.exchange(message(keep_index))) {
            Ok(_) => Ok(keep_index.then_some(wanted)),
            // The index is taken there: refused before anything moved (the device is still
            // here under its name and index), so it moves without, under a new index.
            Err(e)
                if keep_index
                    && matches!(e.errno(), Some(EBUSY | EEXIST))
                    && self
                        .find(name)
                        .await?
                        .is_some_and(|l| l.header.index == index) =>
            {
                self.indexes.remove(name);
                blocking(|| self.exchange(message(false)))
                    .map(|_| None)
                    .map_err(nl(context()))
            }
            Err(e) => Err(nl(context())(e)),
        }
    }

    fn remember(&mut self, name: &str, index: u32) {
        self.indexes.insert(name.to_owned(), index);
    }

    async fn set_link(&mut self, name: &str, change: &LinkChange) -> Result<()> {
        let index = self.index(name).await?;
        let mut msg = Self::change_message(index, change).build();
        Self::add_ipv4_conf(&mut msg, change);
        super::link::add_sizes(&mut msg, &change.sizes);
        self.exchange(self::change(RouteNetlinkMessage::SetLink(msg)))
            .map_err(nl(format!("changing link {name}")))?;
        if let Some(new) = &change.name {
            self.indexes.remove(name);
            self.indexes.insert(new.clone(), index);
        }
        Ok(())
    }

    async fn add_addresses(&mut self, name: &str, addresses: &[Cidr]) -> Result<()> {
        self.add_addresses_now(name, addresses).await
    }

    async fn add_routes(&mut self, name: &str, routes: &[Route]) -> Result<()> {
        self.add_routes_now(name, routes).await
    }

    async fn del_routes(&mut self, name: &str, routes: &[Route]) -> Result<()> {
        self.del_routes_now(name, routes).await
    }

    async fn set_sysctls(&mut self, name: &str, sysctls: &BTreeMap<String, String>) -> Result<()> {
        let mut files = Vec::new();
        for (key, value) in sysctls {
            let Some((family, leaf)) = super::sysctl::family_and_leaf(key) else {
                return Err(Error::kernel(
                    self.describe(),
                    format!("setting sysctls of {name}"),
                    format!("{key} is not a per-interface sysctl"),
                ));
            };
            files.push((
                self.sysctl_root
                    .join(family)
                    .join("conf")
                    .join(name)
                    .join(leaf),
                value.clone(),
            ));
        }
        // /proc/sys/net shows the namespace of the task that opens the file.
        in_namespace(self.ns_path.as_deref(), || {
            for (path, value) in &files {
                let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
                f.write_all(value.as_bytes())?;
            }
            Ok(())
        })
        .map_err(io(format!(
            "writing sysctls of {name} in namespace {}",
            self.describe()
        )))
    }

    async fn offload_sizes(
        &mut self,
        name: &str,
    ) -> Result<Option<knic_proto::netconfig::OffloadSizes>> {
        Ok(self
            .find(name)
            .await?
            .as_ref()
            .map(super::link::reported_sizes))
    }

    async fn set_neighbors(
        &mut self,
        name: &str,
        neighbors: &[knic_proto::netconfig::Neighbor],
    ) -> Result<()> {
        self.set_neighbors_now(name, neighbors).await
    }

    async fn add_child(
        &mut self,
        parent: &str,
        child: NewChild<'_>,
        to: &Ns,
        change: &LinkChange,
    ) -> Result<()> {
        let parent_index = self.index(parent).await?;
        let target = match to {
            Ns::Host => self.host_path.clone(),
            Ns::Pod(p) => p.clone(),
        };
        let fd =
            File::open(&target).map_err(io(format!("opening namespace {}", target.display())))?;
        let name = change.name.clone().unwrap_or_else(|| parent.to_owned());
        // IFLA_LINK is the parent's index in this socket's namespace; IFLA_NET_NS_FD puts the
        // new link in the pod, where name, MTU and MAC apply.
        let msg =
            super::child::new_link_message(&name, parent_index, child, fd.as_raw_fd(), change)?;
        let (what, module) = match child {
            NewChild::Vlan(id) => (format!("creating VLAN {id} on {parent}"), "8021q (VLAN)"),
            other => (
                format!("creating a {} child of {parent}", other.kind()),
                other.kind(),
            ),
        };
        match self.exchange(self::change(RouteNetlinkMessage::NewLink(msg))) {
            Ok(_) => Ok(()),
            Err(e) if e.errno() == Some(EOPNOTSUPP) => Err(Error::kernel(
                self.describe(),
                what,
                format!("the kernel has no {module} support"),
            )),
            Err(e) => Err(Error::io(format!("{what} in namespace {to}"), e.into_io())),
        }
    }

    async fn vf_state(&mut self, pf: &str, index: u32) -> Result<Option<VfState>> {
        let pf_index = self.index(pf).await?;
        let context = format!("reading the VF table of {pf}");
        let replies = self
            .exchange(vf::get_message(pf_index))
            .map_err(nl(context))?;
        Ok(replies.iter().find_map(|m| match m {
            RouteNetlinkMessage::NewLink(link) if link.header.index == pf_index => {
                vf::state_of(link, index)
            }
            _ => None,
        }))
    }

    async fn set_vf(&mut self, pf: &str, index: u32, state: &VfState) -> Result<()> {
        let pf_index = self.index(pf).await?;
        // One request per setting, so a refusal names the one the PF's driver refused (see
        // `vf::settings`); the ones before it stay set, as in one request, for the caller's
        // undo to put back.
        for (field, one) in vf::settings(state) {
            if let Err(e) = self.exchange(vf::set_message(pf_index, index, &one)) {
                let errno = e.errno();
                let io = e.into_io();
                return Err(Error::kernel(
                    Ns::Host,
                    format!(
                        "setting VF {index} of {pf}: {field} ({})",
                        vf::describe(&one)
                    ),
                    match errno {
                        Some(errno) => format!("{}: {io}", vf::refusal(field, errno)),
                        None => io.to_string(),
                    },
                ));
            }
        }
        Ok(())
    }

    async fn set_egress_limit(&mut self, name: &str, limit: &Tbf) -> Result<()> {
        let index = self.index(name).await?;
        let context = format!(
            "limiting the egress of {name} to {} bit/s (tbf burst {} bytes, limit {} bytes)",
            limit.rate.saturating_mul(8),
            limit.burst,
            limit.limit
        );
        match self.exchange(tbf::replace_message(index, limit)) {
            Ok(_) => Ok(()),
            Err(e) if e.errno() == Some(ENOENT) => Err(Error::kernel(
                self.describe(),
                context,
                "the kernel has no tbf qdisc (sch_tbf)",
            )),
            Err(e) => Err(nl(context)(e)),
        }
    }

    async fn clear_egress_limit(&mut self, name: &str) -> Result<()> {
        let index = self.index(name).await?;
        let context = format!("removing the egress limit (tbf) of {name}");
        match self.exchange(tbf::delete_message(index)) {
            Ok(_) => Ok(()),
            // Only the default qdisc is there: nothing of knic's to remove.
            Err(e) if e.errno() == Some(ENOENT) => Ok(()),
            Err(e) => Err(nl(context)(e)),
        }
    }

    async fn ensure_segment(&mut self, segment: &super::overlay::Segment) -> Result<()> {
        self.ensure_segment_now(segment).await
    }

    async fn ethtool_state(
        &mut self,
        name: &str,
        asked: &knic_proto::netconfig::EthtoolSettings,
    ) -> Result<super::ethtool::EthtoolState> {
        self.ethtool_state_now(name, asked).await
    }

    async fn set_ethtool(
        &mut self,
        name: &str,
        settings: &knic_proto::netconfig::EthtoolSettings,
    ) -> Result<()> {
        self.set_ethtool_now(name, settings).await
    }

    async fn add_veth(
        &mut self,
        host: &str,
        bridge: &str,
        to: &Ns,
        mtu: u32,
        change: &LinkChange,
    ) -> Result<()> {
        self.add_veth_now(host, bridge, to, mtu, change).await
    }

    async fn fdb(&mut self, vxlan: &str) -> Result<Vec<super::overlay::FdbEntry>> {
        self.fdb_now(vxlan).await
    }

    async fn set_fdb(
        &mut self,
        vxlan: &str,
        add: &[super::overlay::FdbEntry],
        remove: &[super::overlay::FdbEntry],
    ) -> Result<()> {
        self.set_fdb_now(vxlan, add, remove).await
    }

    async fn add_rules(&mut self, rules: &[super::routing::Rule]) -> Result<()> {
        self.add_rules_now(rules).await
    }

    async fn del_rules(&mut self, rules: &[super::routing::Rule]) -> Result<()> {
        self.del_rules_now(rules).await
    }

    async fn vrf(&mut self, name: &str) -> Result<Option<super::routing::VrfLink>> {
        self.vrf_now(name).await
    }

    async fn add_vrf(&mut self, vrf: &super::routing::Vrf) -> Result<()> {
        self.add_vrf_now(vrf).await
    }

    async fn set_master(&mut self, name: &str, master: &str) -> Result<()> {
        self.set_master_now(name, master).await
    }

    async fn del_link(&mut self, name: &str) -> Result<()> {
        let index = match self.indexes.get(name) {
            Some(index) => *index,
            None => match self.find(name).await? {
                Some(msg) => msg.header.index,
                None => return Ok(()),
            },
        };
        self.indexes.remove(name);
        let mut del = LinkMessage::default();
        del.header.index = index;
        let mut request = NetlinkMessage::from(RouteNetlinkMessage::DelLink(del));
        request.header.flags = NLM_F_REQUEST | NLM_F_ACK;
        // Unregistering a device waits in `rcu_barrier()` under RTNL too, as a move does.
        match blocking(|| self.exchange(request)) {
            Ok(_) => Ok(()),
            // ENODEV: gone since this session looked it up; nothing left to delete.
            Err(e) if e.errno() == Some(ENODEV) => Ok(()),
            Err(e) => Err(nl(format!("deleting link {name}"))(e)),
        }
    }
}

/// Runs `f`, a namespace move or a deletion, which holds the calling thread ~16 ms in the kernel
/// (`rcu_barrier()` under RTNL): on a multi-threaded runtime the worker hands its other tasks
/// to another thread first, so gRPC calls, checkpoint writes and other pods' hooks go on
/// meanwhile. Other requests run inline: they take microseconds unless they queue for RTNL
/// behind a move, and handing them off would cost more than most of them take.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Whether the kernel honours `IFLA_NEW_IFINDEX` on a namespace move (Linux 5.6 on; an older
/// kernel ignores the attribute, and would give the device another index where its own is
/// taken: then the index a move returns would name another link). Read once.
fn keeps_index_on_request() -> bool {
    static KEEPS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KEEPS.get_or_init(|| {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        release_at_least(&release, (5, 6))
    })
}

/// Whether a kernel release string (`6.1.0-27-amd64`) is at least `major.minor`.
fn release_at_least(release: &str, (major, minor): (u32, u32)) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// Whether this kernel can create VLAN (802.1Q) links; kernel tests skip VLAN cases without it.
pub fn kernel_has_8021q() -> bool {
    Path::new("/sys/module/8021q").exists() || Path::new("/proc/net/vlan").exists()
}

#[cfg(test)]
mod tests;
