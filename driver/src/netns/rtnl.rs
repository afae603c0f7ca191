//! The kernel, through rtnetlink. Each pod session owns one netlink socket created inside its
//! namespace (host sessions reuse pooled ones, see [`host_connection`]): a socket stays bound to the
//! namespace it was created in, so the calling thread
//! `setns`es into the pod's namespace only for the synchronous call that creates the socket
//! (or opens sysctl files) and straight back, with no await in between, so no other task ever
//! runs there. A session in the process's own namespace needs no switch at all. (A thread per
//! session cost ~1–2 ms per open on a loaded node: most of knic's cost above the kernel's.)

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write as _;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::{StreamExt, TryStreamExt};
use knic_proto::netconfig::{Cidr, Route};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressScope};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::route::{RouteMessage, RouteScope};
use nix::sched::{CloneFlags, setns};
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};

use super::tbf::{self, Tbf};
use super::vf::{self, VfState};
use super::{Kernel, LinkChange, LinkState, NewChild, Ns, Session};
use crate::error::{Error, Result};

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

/// One rtnetlink socket in one namespace.
pub struct RtnlSession {
    handle: Handle,
    /// The connection task this session holds, aborted with a pod's session; a host session's
    /// goes back to the pool instead (see [`host_connection`]).
    task: Option<tokio::task::JoinHandle<()>>,
    /// A host session: its connection is returned to the pool on drop.
    pooled: bool,
    /// The namespace file, for sysctl writes (`None`: the process's own).
    ns_path: Option<PathBuf>,
    host_path: PathBuf,
    sysctl_root: PathBuf,
    /// ifindex by name, as looked up (or renamed) in this session: one lookup per name.
    indexes: HashMap<String, u32>,
    requests: Arc<AtomicU64>,
}

impl Drop for RtnlSession {
    fn drop(&mut self) {
        let Some(task) = self.task.take() else {
            return;
        };
        if self.pooled {
            give_back(self.ns_path.take(), self.handle.clone(), task);
        } else {
            task.abort();
        }
    }
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(context, e)
}

fn nl(context: String) -> impl FnOnce(rtnetlink::Error) -> Error {
    move |e| {
        let text = e.to_string();
        Error::io(context, std::io::Error::other(text))
    }
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
    let home = File::open("/proc/thread-self/ns/net")?;
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

/// A new rtnetlink socket in the namespace at `path` (`None`: the thread's own), its
/// connection driven by a task of the current runtime.
fn connect(path: Option<&Path>) -> std::io::Result<(Handle, tokio::task::JoinHandle<()>)> {
    let runtime = tokio::runtime::Handle::current();
    let (connection, handle, _) = in_namespace(path, || {
        let _entered = runtime.enter();
        rtnetlink::new_connection()
    })?;
    Ok((handle, tokio::spawn(connection)))
}

/// Idle host connections of this thread: (host namespace path, handle, connection task).
type HostConnections = Vec<(Option<PathBuf>, Handle, tokio::task::JoinHandle<()>)>;

/// Idle host connections kept per thread; more than this many sessions at once open their own
/// sockets, which are closed when they end.
const IDLE_HOST_CONNECTIONS: usize = 8;

thread_local! {
    static HOST_CONNECTIONS: std::cell::RefCell<HostConnections> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// A host namespace rtnetlink socket for one session's exclusive use, taken from this thread's
/// pool of idle ones or opened, so a host session usually costs no socket, task or
/// first-request set-up. Exclusive, not shared: the kernel runs one dump at a time per netlink
/// socket and answers a second with EBUSY, and concurrent pods' host sessions dump links and
/// addresses at the same time. Pooled per thread: the connection task runs on the runtime that
/// opened it, and a thread runs one runtime at a time (tests and benchmarks build a runtime per
/// case); a connection whose runtime is gone (its task finished) is dropped. Host sockets keep
/// no pod namespace alive, unlike a pod's.
fn host_connection(path: Option<&Path>) -> Result<(Handle, tokio::task::JoinHandle<()>)> {
    let idle = HOST_CONNECTIONS
        .try_with(|cell| {
            let mut connections = cell.borrow_mut();
            connections.retain(|(_, _, task)| !task.is_finished());
            let at = connections
                .iter()
                .position(|(p, _, _)| p.as_deref() == path)?;
            let (_, handle, task) = connections.swap_remove(at);
            Some((handle, task))
        })
        .ok()
        .flatten();
    match idle {
        Some(connection) => Ok(connection),
        None => connect(path).map_err(io("opening rtnetlink in namespace host".to_owned())),
    }
}

/// Returns a host session's connection to the pool of the thread that ends the session (any
/// thread of the same runtime can drive it), or closes it when the pool is full.
fn give_back(path: Option<PathBuf>, handle: Handle, task: tokio::task::JoinHandle<()>) {
    if task.is_finished() {
        return;
    }
    let mut task = Some(task);
    let _ = HOST_CONNECTIONS.try_with(|cell| {
        if let Ok(mut connections) = cell.try_borrow_mut()
            && connections.len() < IDLE_HOST_CONNECTIONS
            && let Some(task) = task.take()
        {
            connections.push((path, handle, task));
        }
    });
    if let Some(task) = task {
        task.abort();
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
        let (handle, task) = match ns {
            Ns::Host => {
                let (handle, task) = host_connection(ns_path.as_deref())?;
                (handle, Some(task))
            }
            Ns::Pod(_) => {
                let (handle, task) = connect(ns_path.as_deref())
                    .map_err(io(format!("opening rtnetlink in namespace {ns}")))?;
                (handle, Some(task))
            }
        };
        Ok(Some(RtnlSession {
            handle,
            task,
            pooled: matches!(ns, Ns::Host),
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

fn is_exists(e: &rtnetlink::Error) -> bool {
    matches!(e, rtnetlink::Error::NetlinkError(m) if m.raw_code() == -libc_eexist())
}

const fn libc_eexist() -> i32 {
    17
}

/// `ENOENT`: the kernel's answer to an unknown qdisc kind, and to deleting a default qdisc.
const ENOENT: i32 = 2;
/// `ENODEV`: the link is gone (since this session looked it up).
const ENODEV: i32 = 19;

impl RtnlSession {
    fn sent(&self, requests: u64) {
        self.requests.fetch_add(requests, Ordering::Relaxed);
    }

    async fn find(&mut self, name: &str) -> Result<Option<LinkMessage>> {
        self.sent(1);
        let mut links = self
            .handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute();
        match links.try_next().await {
            Ok(link) => {
                if let Some(l) = &link {
                    self.indexes.insert(name.to_owned(), l.header.index);
                }
                Ok(link)
            }
            // ENODEV: no such link.
            Err(rtnetlink::Error::NetlinkError(m)) if m.raw_code() == -ENODEV => Ok(None),
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

    /// Sends `request` and returns its replies' inner messages, or the kernel's error (an
    /// acknowledgement is an error message without a code, and is not one).
    async fn exchange(
        &mut self,
        request: NetlinkMessage<RouteNetlinkMessage>,
        context: &str,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        self.sent(1);
        let mut replies = self
            .handle
            .request(request)
            .map_err(nl(context.to_owned()))?;
        let mut out = Vec::new();
        while let Some(reply) = replies.next().await {
            match reply.payload {
                NetlinkPayload::InnerMessage(m) => out.push(m),
                NetlinkPayload::Error(e) if e.code.is_some() => {
                    return Err(Error::io(context.to_owned(), e.to_io()));
                }
                _ => {}
            }
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        self.ns_path
            .as_ref()
            .map_or_else(|| "host".to_string(), |p| p.display().to_string())
    }

    async fn read_addresses(&self, index: u32) -> Result<Vec<Cidr>> {
        self.sent(1);
        let mut out = Vec::new();
        let mut stream = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute();
        while let Some(msg) = stream
            .try_next()
            .await
            .map_err(nl(format!("reading addresses of link {index}")))?
        {
            if msg.header.index != index || msg.header.scope != AddressScope::Universe {
                continue;
            }
            // IPv4 reports the interface address as IFA_LOCAL; IPv6 only has IFA_ADDRESS.
            let local = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(ip) => Some(*ip),
                _ => None,
            });
            let address = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            });
            if let Some(addr) = local.or(address) {
                out.push(Cidr {
                    addr,
                    prefix_len: msg.header.prefix_len,
                });
            }
        }
        Ok(out)
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
}

impl RtnlSession {
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

    /// Sends every request (creations: an existing object is fine) before reading the first
    /// answer, so the kernel's acknowledgements come back in one round trip. The first
    /// failure is returned with its request's context.
    async fn create_all(&mut self, requests: Vec<(RouteNetlinkMessage, String)>) -> Result<()> {
        let mut pending = Vec::with_capacity(requests.len());
        for (message, context) in requests {
            let mut req = NetlinkMessage::from(message);
            req.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE;
            self.sent(1);
            let replies = self.handle.request(req).map_err(nl(context.clone()))?;
            pending.push((replies, context));
        }
        let mut first = None;
        for (mut replies, context) in pending {
            while let Some(reply) = replies.next().await {
                if let NetlinkPayload::Error(e) = reply.payload
                    && e.code.is_some()
                {
                    let e = rtnetlink::Error::NetlinkError(e);
                    if !is_exists(&e) && first.is_none() {
                        first = Some(nl(context.clone())(e));
                    }
                }
            }
        }
        first.map_or(Ok(()), Err)
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
        let mut out = Vec::new();
        let mut stream = self.handle.link().get().execute();
        while let Some(msg) = stream
            .try_next()
            .await
            .map_err(nl("listing links".into()))?
        {
            out.push(state(&msg));
        }
        Ok(out)
    }

    async fn move_link(&mut self, name: &str, to: &Ns, change: &LinkChange) -> Result<()> {
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
        let mut msg = Self::change_message(index, change)
            .setns_by_fd(fd.as_raw_fd())
            .build();
        Self::add_ipv4_conf(&mut msg, change);
        // Gone from this namespace, also when the kernel moved it and then refused the name.
        self.indexes.remove(name);
        self.sent(1);
        self.handle
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(nl(format!("moving {name} into namespace {to}")))
    }

    async fn set_link(&mut self, name: &str, change: &LinkChange) -> Result<()> {
        let index = self.index(name).await?;
        let mut msg = Self::change_message(index, change).build();
        Self::add_ipv4_conf(&mut msg, change);
        self.sent(1);
        self.handle
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(nl(format!("changing link {name}")))?;
        if let Some(new) = &change.name {
            self.indexes.remove(name);
            self.indexes.insert(new.clone(), index);
        }
        Ok(())
    }

    async fn add_addresses(&mut self, name: &str, addresses: &[Cidr]) -> Result<()> {
        if addresses.is_empty() {
            return Ok(());
        }
        let index = self.index(name).await?;
        let mut requests = Vec::with_capacity(addresses.len());
        for address in addresses {
            let mut req = self
                .handle
                .address()
                .add(index, address.addr, address.prefix_len);
            if address.addr.is_ipv6() {
                // No duplicate address detection: the address is usable the moment the pod
                // starts.
                req.message_mut()
                    .attributes
                    .push(AddressAttribute::Flags(AddressFlags::Nodad));
            }
            requests.push((
                RouteNetlinkMessage::NewAddress(req.message_mut().clone()),
                format!("adding address {address} to {name}"),
            ));
        }
        self.create_all(requests).await
    }

    async fn add_routes(&mut self, name: &str, routes: &[Route]) -> Result<()> {
        if routes.is_empty() {
            return Ok(());
        }
        let index = self.index(name).await?;
        let requests = routes
            .iter()
            .map(|route| {
                (
                    RouteNetlinkMessage::NewRoute(route_message(index, route)),
                    format!("adding route {} via {name}", route.destination),
                )
            })
            .collect();
        self.create_all(requests).await
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
        self.sent(1);
        self.handle.link().add(msg).execute().await.map_err(|e| {
            let text = e.to_string();
            if text.contains("Operation not supported") || text.contains("-95") {
                Error::kernel(
                    self.describe(),
                    what,
                    format!("the kernel has no {module} support"),
                )
            } else {
                Error::io(
                    format!("{what} in namespace {to}"),
                    std::io::Error::other(text),
                )
            }
        })
    }

    async fn vf_state(&mut self, pf: &str, index: u32) -> Result<Option<VfState>> {
        let pf_index = self.index(pf).await?;
        let context = format!("reading the VF table of {pf}");
        let replies = self.exchange(vf::get_message(pf_index), &context).await?;
        Ok(replies.iter().find_map(|m| match m {
            RouteNetlinkMessage::NewLink(link) if link.header.index == pf_index => {
                vf::state_of(link, index)
            }
            _ => None,
        }))
    }

    async fn set_vf(&mut self, pf: &str, index: u32, state: &VfState) -> Result<()> {
        let pf_index = self.index(pf).await?;
        let context = format!("setting VF {index} of {pf} ({})", vf::describe(state));
        self.exchange(vf::set_message(pf_index, index, state), &context)
            .await
            .map(drop)
    }

    async fn set_egress_limit(&mut self, name: &str, limit: &Tbf) -> Result<()> {
        let index = self.index(name).await?;
        let context = format!(
            "limiting the egress of {name} to {} bit/s (tbf burst {} bytes, limit {} bytes)",
            limit.rate.saturating_mul(8),
            limit.burst,
            limit.limit
        );
        match self
            .exchange(tbf::replace_message(index, limit), &context)
            .await
        {
            Ok(_) => Ok(()),
            Err(Error::Io { source, .. }) if source.raw_os_error() == Some(ENOENT) => {
                Err(Error::kernel(
                    self.describe(),
                    context,
                    "the kernel has no tbf qdisc (sch_tbf)",
                ))
            }
            Err(e) => Err(e),
        }
    }

    async fn clear_egress_limit(&mut self, name: &str) -> Result<()> {
        let index = self.index(name).await?;
        let context = format!("removing the egress limit (tbf) of {name}");
        match self.exchange(tbf::delete_message(index), &context).await {
            Ok(_) => Ok(()),
            // Only the default qdisc is there: nothing of knic's to remove.
            Err(Error::Io { source, .. }) if source.raw_os_error() == Some(ENOENT) => Ok(()),
            Err(e) => Err(e),
        }
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
        self.sent(1);
        match self.handle.link().del(index).execute().await {
            Ok(()) => Ok(()),
            // ENODEV: gone since this session looked it up; nothing left to delete.
            Err(rtnetlink::Error::NetlinkError(m)) if m.raw_code() == -ENODEV => Ok(()),
            Err(e) => Err(nl(format!("deleting link {name}"))(e)),
        }
    }
}

/// A route's metric and table, the same for both families.
fn metric_and_table<T>(mut b: RouteMessageBuilder<T>, route: &Route) -> RouteMessageBuilder<T> {
    if let Some(m) = route.metric {
        b = b.priority(m);
    }
    if let Some(t) = route.table {
        b = b.table_id(t);
    }
    b
}

/// The RTM_NEWROUTE of `route` through the link with ifindex `index`.
fn route_message(index: u32, route: &Route) -> RouteMessage {
    match route.destination.addr {
        IpAddr::V4(dst) => {
            let mut b = RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                .destination_prefix(dst, route.destination.prefix_len)
                .output_interface(index);
            if let Some(IpAddr::V4(gw)) = route.gateway {
                b = b.gateway(gw);
            } else {
                b = b.scope(RouteScope::Link);
            }
            if let Some(IpAddr::V4(src)) = route.source {
                b = b.pref_source(src);
            }
            metric_and_table(b, route).build()
        }
        IpAddr::V6(dst) => {
            let mut b = RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                .destination_prefix(dst, route.destination.prefix_len)
                .output_interface(index);
            if let Some(IpAddr::V6(gw)) = route.gateway {
                b = b.gateway(gw);
            }
            if let Some(IpAddr::V6(src)) = route.source {
                b = b.pref_source(src);
            }
            metric_and_table(b, route).build()
        }
    }
}

/// Whether this kernel can create VLAN (802.1Q) links; kernel tests skip VLAN cases without it.
pub fn kernel_has_8021q() -> bool {
    Path::new("/sys/module/8021q").exists() || Path::new("/proc/net/vlan").exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel answers a second dump on one netlink socket with EBUSY: host sessions of
    /// pods handled at once must not share a socket. Reads only the process's own links, so
    /// it needs no privilege.
    #[tokio::test(flavor = "current_thread")]
    async fn concurrent_host_sessions_dump_at_once() {
        let kernel = Rtnl::new(None);
        let mut sessions = Vec::new();
        for _ in 0..12 {
            sessions.push(kernel.open(&Ns::Host).await.unwrap().unwrap());
        }
        let dumps = sessions.iter_mut().map(|s| s.links());
        for links in futures::future::join_all(dumps).await {
            let links = links.expect("a host session's dump failed");
            assert!(links.iter().any(|l| l.name == "lo"), "no lo in {links:?}");
        }
        // Ended sessions give their sockets back: the next ones reuse them.
        drop(sessions);
        let idle = HOST_CONNECTIONS.with(|c| c.borrow().len());
        assert_eq!(idle, IDLE_HOST_CONNECTIONS);
        let _again = kernel.open(&Ns::Host).await.unwrap().unwrap();
        assert_eq!(
            HOST_CONNECTIONS.with(|c| c.borrow().len()),
            IDLE_HOST_CONNECTIONS - 1
        );
    }
}
